/*
 * spin_barrier.h: what the C tests' racing threads share: a pause for spin loops, busy work
 * to shift one thread against another, and a barrier that releases every party at once.
 * Header-only, for core_test.c and core_race_test.c.
 */
#ifndef SPIN_BARRIER_H
#define SPIN_BARRIER_H

#include <sched.h>
#include <stdatomic.h>

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Busy work of a chosen length, to shift one thread against another. Not synchronisation. */
static inline void spin_for(unsigned iterations) {
    for (volatile unsigned i = 0; i < iterations; i++) {
    }
}

/*
 * Sense-reversing spin barrier: releases all parties within a few cycles of each other
 * (a futex barrier wakes them one by one, which would rarely let them race). Spins yield
 * after a while so that more parties than cores still make progress.
 * acq_rel on the arrival and release/acquire on the generation order everything each
 * party did before the barrier before everything any party does after it.
 */
typedef struct {
    atomic_uint arrived;
    atomic_uint generation;
    unsigned parties;
} spin_barrier;

static inline void spin_barrier_init(spin_barrier *b, unsigned parties) {
    atomic_init(&b->arrived, 0);
    atomic_init(&b->generation, 0);
    b->parties = parties;
}

static inline void spin_barrier_wait(spin_barrier *b) {
    unsigned generation = atomic_load_explicit(&b->generation, memory_order_acquire);
    if (atomic_fetch_add_explicit(&b->arrived, 1, memory_order_acq_rel) + 1 == b->parties) {
        atomic_store_explicit(&b->arrived, 0, memory_order_relaxed);
        atomic_store_explicit(&b->generation, generation + 1, memory_order_release);
        return;
    }
    for (unsigned spins = 0;
         atomic_load_explicit(&b->generation, memory_order_acquire) == generation; spins++) {
        if (spins < 200) {
            cpu_relax();
        } else {
            sched_yield();
        }
    }
}

#endif /* SPIN_BARRIER_H */
