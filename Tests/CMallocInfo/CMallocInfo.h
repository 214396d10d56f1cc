/*
 * For the memory tests: the bytes a process has allocated with malloc and not freed.
 * Exact, unlike the resident set (freed pages stay resident in malloc's arenas).
 */
#ifndef CMALLOCINFO_H
#define CMALLOCINFO_H

#include <stdlib.h>

#if defined(__GLIBC__)
#include <malloc.h>
/* glibc's count of bytes in use (mallinfo2, glibc 2.33 and later): chunks in the arenas
   plus the large blocks malloc maps on their own. */
static inline long cmi_malloc_bytes_in_use(void) {
    struct mallinfo2 info = mallinfo2();
    return (long)(info.uordblks + info.hblkhd);
}
#else
/* Not available here: -1. */
static inline long cmi_malloc_bytes_in_use(void) { return -1; }
#endif

#endif /* CMALLOCINFO_H */
