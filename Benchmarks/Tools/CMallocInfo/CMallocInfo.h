/*
 * For the memory cases: the bytes a process has allocated with malloc and not freed.
 * Exact, unlike the resident set (freed pages stay resident in malloc's arenas).
 */
#ifndef CMALLOCINFO_H
#define CMALLOCINFO_H

#include <stdlib.h>

#if defined(__GLIBC__)
#include <malloc.h>

/* One arena for every thread, so that cmi_malloc_bytes_in_use sees what the event loop's
   thread allocates too (mallinfo2 reports the main arena). Call before starting threads. */
static inline void cmi_use_one_arena(void) { mallopt(M_ARENA_MAX, 1); }

/* glibc's count of bytes in use (mallinfo2, glibc 2.33 and later): chunks in the arena,
   their headers included, plus the large blocks malloc maps on their own. */
static inline long cmi_malloc_bytes_in_use(void) {
    struct mallinfo2 info = mallinfo2();
    return (long)(info.uordblks + info.hblkhd);
}
#else
static inline void cmi_use_one_arena(void) {}
/* Not available here: -1. */
static inline long cmi_malloc_bytes_in_use(void) { return -1; }
#endif

#endif /* CMALLOCINFO_H */
