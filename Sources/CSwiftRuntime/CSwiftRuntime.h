/*
 * Entry points of the Swift runtime (libswiftCore, which every Swift program links) that
 * the overlay calls directly, and at the end two of Dispatch's, below its Swift overlay.
 * Declared here, in C, so that Swift calls them with the C calling convention the runtime
 * exports them with; Swift reserves their names for @_silgen_name. The C core never uses
 * them: its tests link without the Swift runtime.
 */
#ifndef CSWIFTRUNTIME_H
#define CSWIFTRUNTIME_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Retains `object` and returns it, or returns NULL without retaining once the object has
 * begun deinitialising (its strong count reached zero). One CAS on the object's reference
 * count word, which also holds the deiniting flag. Valid only while the object's memory is
 * (the caller must know it has not been freed; see UnownedLink in the overlay).
 * Declared in the runtime's swift/Runtime/HeapObject.h as HeapObject *(HeapObject *).
 */
void *_Nullable swift_tryRetain(void *_Nonnull object);

/*
 * Adds to / drops from `object`'s unowned reference count, which keeps its memory (not
 * the object: its deinit still runs when the strong count reaches zero) until the count
 * reaches zero; the last drop frees it. While held, swift_tryRetain on the object is
 * valid. Declared in HeapObject.h as HeapObject *(HeapObject *) and void (HeapObject *).
 */
void *_Nonnull swift_unownedRetain(void *_Nonnull object);
void swift_unownedRelease(void *_Nonnull object);

/*
 * The common case of swift_unownedRetain and swift_unownedRelease, inline: one CAS on the
 * count word, where the runtime's entry points cost about 50 and 35 instructions (a call
 * through the PLT, its own checks, and a CAS loop). Only for a native Swift object on a
 * 64-bit target whose count word has the layout the overlay checked
 * (`RefCountWord.layoutAsExpected`): bits 1-31 the unowned count, bit 63 "slow" (a side
 * table, or an immortal object). Each returns false, changing nothing, where the runtime
 * must decide: a slow word (the count then lives in the side table), an unowned count
 * about to overflow, or a release of the last unowned reference (which frees the
 * memory); the caller then calls the runtime. Orderings: relaxed for the increment, as
 * the runtime's (`RefCount.h`); release for the decrement, where the runtime's is relaxed
 * too: no weaker than it, so that this thread's accesses to the object come before
 * whoever frees it (the same instruction on x86-64).
 */
#define PC_RC_UNOWNED_ONE ((unsigned long long)1 << 1)
#define PC_RC_UNOWNED_MASK ((unsigned long long)0x7fffffff << 1)
#define PC_RC_SLOW ((unsigned long long)1 << 63)

static inline _Bool pc_rc_unowned_retain_fast(void *_Nonnull object) {
#if defined(__LP64__) && (defined(__GNUC__) || defined(__clang__))
    unsigned long long *word = (unsigned long long *)((char *)object + sizeof(void *));
    unsigned long long seen = __atomic_load_n(word, __ATOMIC_RELAXED);
    for (;;) {
        if ((seen & PC_RC_SLOW) != 0 || (seen & PC_RC_UNOWNED_MASK) == PC_RC_UNOWNED_MASK) {
            return 0;
        }
        if (__atomic_compare_exchange_n(word, &seen, seen + PC_RC_UNOWNED_ONE, 1,
                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
            return 1;
        }
    }
#else
    (void)object;
    return 0;
#endif
}

static inline _Bool pc_rc_unowned_release_fast(void *_Nonnull object) {
#if defined(__LP64__) && (defined(__GNUC__) || defined(__clang__))
    unsigned long long *word = (unsigned long long *)((char *)object + sizeof(void *));
    unsigned long long seen = __atomic_load_n(word, __ATOMIC_RELAXED);
    for (;;) {
        /* At most one unowned reference left: this drop may free the memory. */
        if ((seen & PC_RC_SLOW) != 0 || (seen & PC_RC_UNOWNED_MASK) <= PC_RC_UNOWNED_ONE) {
            return 0;
        }
        if (__atomic_compare_exchange_n(word, &seen, seen - PC_RC_UNOWNED_ONE, 1,
                                        __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {
            return 1;
        }
    }
#else
    (void)object;
    return 0;
#endif
}

/*
 * True if `object`'s strong reference count is one (the caller's reference is the only
 * one): what isKnownUniquelyReferenced calls, without needing a strong variable.
 * Declared in HeapObject.h as bool (const void *).
 */
_Bool swift_isUniquelyReferenced_nonNull_native(const void *_Nonnull object);

/*
 * The runtime's allocator, what Swift objects are made with: malloc and free when
 * `alignMask` is at most malloc's own alignment. (The standard library's
 * UnsafeMutableRawPointer.allocate passes an alignment mask of all ones, which takes the
 * aligned path, posix_memalign, about 45 instructions more per allocation.) Declared in
 * the runtime's swift/Runtime/Heap.h as void *(size_t, size_t) and
 * void (void *, size_t, size_t).
 */
void *_Nonnull swift_slowAlloc(size_t size, size_t alignMask);
void swift_slowDealloc(void *_Nonnull pointer, size_t size, size_t alignMask);

/*
 * Dispatch's function variants of async, which take a C function and its argument where
 * async takes a block. Why: a block costs a malloc and a free per call (Block_copy), and
 * the work a promise sends to a queue is one call on one object. Dispatch's Swift overlay
 * does not export them on Linux, so they are declared here, under names of our own bound
 * to Dispatch's symbols, which keeps them apart from Dispatch's own declarations (whose
 * queue parameter has Dispatch's type; here it is `void *`, the address the overlay's
 * DispatchBridge reads out of a DispatchQueue). Declared in dispatch/queue.h as
 * void (dispatch_queue_t, void *, dispatch_function_t); libdispatch is linked into every
 * program that imports Dispatch.
 */
typedef void (*pc_dispatch_function)(void *_Nullable context);
#if defined(__linux__)
void pc_dispatch_async_f(void *_Nonnull queue, void *_Nullable context,
                         pc_dispatch_function _Nonnull work) __asm__("dispatch_async_f");
void pc_dispatch_barrier_async_f(void *_Nonnull queue, void *_Nullable context,
                                 pc_dispatch_function _Nonnull work) __asm__("dispatch_barrier_async_f");
#endif

#ifdef __cplusplus
}
#endif

#endif /* CSWIFTRUNTIME_H */
