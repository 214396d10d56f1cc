/* The system library the C core builds on: libatomic_ops (atomic_ops.h). */
#include <atomic_ops.h>
