/*
 * core_test: tests CPromiseCore alone, from C, with pthreads.
 *
 *   gcc -std=c11 -O2 -Wall -Wextra -Werror -pthread -I Sources/CPromiseCore/include \
 *       Sources/CPromiseCore/CPromiseCore.c Tests/CoreTests/core_test.c -o /tmp/core_test
 *
 * (also clean with clang, -fsanitize=thread and -fsanitize=address,undefined).
 *
 * Each test prints "ok - <name> (<rounds> rounds)" or "not ok - <name>: <detail>"; lines
 * starting with '#' are diagnostics (configuration, how often a race window was hit).
 * The last line is "N passed, M failed"; the exit status is non-zero when M > 0.
 *
 * Environment (stress tests only):
 *   PROMISE_STRESS_ITERATIONS  rounds of each stress test (defaults below)
 *   PROMISE_STRESS_SECONDS     wall-clock cap per stress test: the loop stops early once
 *                              exceeded, after at least MIN_STRESS_ROUNDS rounds
 *
 * Test model: an `observer` embeds a pc_node and records what its fire callback saw.
 * A `test_promise` puts a plain (non-atomic) payload next to the pc_promise: the claim
 * winner writes it, then calls pc_publish; every observer reads it and must see the
 * winner's value. That checks the release/acquire publication, and TSan checks it too.
 */
#define _POSIX_C_SOURCE 200809L

#include "CPromiseCore.h"
#include "spin_barrier.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- reporting ------------------------------------------------------------------- */

/* The first failed check of a test, with the line that failed and a detail. */
typedef struct {
    bool failed;
    bool in_round;       /* stress tests: the failure happened in `round` */
    unsigned long round;
    char detail[400];
} verdict;

static void verdict_fail(verdict *v, int line, const char *format, ...) {
    if (v->failed) {
        return; /* keep the first failure: later ones are usually its consequences */
    }
    v->failed = true;
    int used = snprintf(v->detail, sizeof v->detail, "line %d: ", line);
    va_list args;
    va_start(args, format);
    vsnprintf(v->detail + used, sizeof v->detail - (size_t)used, format, args);
    va_end(args);
}

/* Records the failure and leaves the current function: the state after a failed check
 * is not worth checking further. Callers of a helper test v->failed after it returns. */
#define CHECK(v, condition, ...)                              \
    do {                                                      \
        if (!(condition)) {                                   \
            verdict_fail((v), __LINE__, __VA_ARGS__);         \
            return;                                           \
        }                                                     \
    } while (0)

static unsigned tests_passed;
static unsigned tests_failed;

static void report(const char *name, const verdict *v, unsigned long rounds) {
    if (v->failed && v->in_round) {
        tests_failed += 1;
        printf("not ok - %s: round %lu: %s\n", name, v->round, v->detail);
    } else if (v->failed) {
        tests_failed += 1;
        printf("not ok - %s: %s\n", name, v->detail);
    } else {
        tests_passed += 1;
        printf("ok - %s (%lu rounds)\n", name, rounds);
    }
    fflush(stdout);
}

/* Runs a single-round test and reports it. */
static void run_test(const char *name, void (*test)(verdict *)) {
    verdict v = {0};
    test(&v);
    report(name, &v, 1);
}

/* ---- the test model: promises with a payload, observers ------------------------- */

typedef struct {
    pc_promise core;
    uint64_t payload; /* plain: written by the claim winner before pc_publish */
} test_promise;

static test_promise *promise_of(pc_promise *core) {
    return (test_promise *)(void *)((char *)core - offsetof(test_promise, core));
}

/* Claims `outcome`; the winner writes the payload, then publishes. */
static bool settle(test_promise *p, uintptr_t expected, uintptr_t outcome, uint64_t payload) {
    if (!pc_claim(&p->core, expected, outcome)) {
        return false;
    }
    p->payload = payload;
    pc_publish(&p->core);
    return true;
}

/* Which thread runs: 0 is the main thread, crew members are numbered from 1. */
static _Thread_local unsigned thread_tag;

/* Global order of fire callbacks, across threads (gives "fired before" a meaning). */
static atomic_ulong fire_clock;

typedef struct observer {
    pc_node node;          /* first member: the callback casts the node back */
    atomic_uint fired;     /* settle fires (source != NULL): must end at exactly 1 */
    atomic_uint deferred;  /* pc_defer fires (source == NULL) */
    pc_promise *source;    /* what the settle fire got */
    uintptr_t outcome;     /* pc_state(source) inside the callback */
    uint64_t payload;      /* the payload inside the callback */
    unsigned long fire_seq;
    unsigned fired_by;     /* thread_tag of the firing thread */
    unsigned registrar;    /* who registered it ... */
    unsigned seq;          /* ... and as its how-manieth */
    bool settler_had_fired; /* case 4: the settler had begun firing before registration */
} observer;

/* Plain writes on purpose: two settle fires of one node from two threads are a data race
 * TSan reports, on top of `fired` ending at 2.
 * The payload is read first: being fired must be enough to see it. Any atomic before it
 * (pc_state's acquire, the fire clock's read-modify-write) would synchronise with the
 * settler by itself and hide a missing acquire in the core from TSan. */
static void observer_record(observer *o, pc_promise *source) {
    o->payload = promise_of(source)->payload;
    o->fire_seq = atomic_fetch_add(&fire_clock, 1);
    o->source = source;
    o->outcome = pc_state(source);
    o->fired_by = thread_tag;
    atomic_fetch_add(&o->fired, 1);
}

static void observer_fire(pc_node *node, pc_promise *source) {
    observer *o = (observer *)(void *)node;
    if (source == NULL) {
        atomic_fetch_add(&o->deferred, 1);
        return;
    }
    observer_record(o, source);
}

static void observer_init(observer *o, pc_fire_fn fire, unsigned registrar, unsigned seq) {
    memset(o, 0, sizeof *o);
    atomic_init(&o->fired, 0);
    atomic_init(&o->deferred, 0);
    o->node.fire = fire;
    o->registrar = registrar;
    o->seq = seq;
}

/* Checks a finished observer: fired once, never deferred, saw `source` settled with
 * `outcome` and `payload`. */
static void check_observer(verdict *v, observer *o, const char *what, pc_promise *source,
                           uintptr_t outcome, uint64_t payload) {
    unsigned fired = atomic_load(&o->fired);
    CHECK(v, fired == 1, "%s (registrar %u, #%u) fired %u times, want 1", what, o->registrar,
          o->seq, fired);
    CHECK(v, atomic_load(&o->deferred) == 0, "%s (#%u) got a source == NULL fire", what, o->seq);
    CHECK(v, o->source == source, "%s (#%u) fired with source %p, want %p", what, o->seq,
          (void *)o->source, (void *)source);
    CHECK(v, o->outcome == outcome, "%s (registrar %u, #%u) saw outcome %lu, want %lu", what,
          o->registrar, o->seq, (unsigned long)o->outcome, (unsigned long)outcome);
    CHECK(v, o->payload == payload, "%s (registrar %u, #%u) saw payload %#llx, want %#llx", what,
          o->registrar, o->seq, (unsigned long long)o->payload, (unsigned long long)payload);
}

/* Checks that observers[0..count) fired in that order (by the global fire clock). */
static void check_fire_order(verdict *v, observer *const *observers, size_t count,
                             const char *what) {
    for (size_t i = 1; i < count; i++) {
        CHECK(v, observers[i - 1]->fire_seq < observers[i]->fire_seq,
              "%s: #%u fired after #%u (clock %lu > %lu)", what, observers[i - 1]->seq,
              observers[i]->seq, observers[i - 1]->fire_seq, observers[i]->fire_seq);
    }
}

static unsigned fired_count(observer *o) {
    return atomic_load(&o->fired);
}

/* ---- 1. single thread ------------------------------------------------------------- */

enum { ORDER_OBSERVERS = 64 };

/* Claim, state and publish on one thread; observers fire in registration order. */
static void test_settle_fires_in_order(verdict *v) {
    test_promise p = {0};
    observer obs[ORDER_OBSERVERS];
    observer *order[ORDER_OBSERVERS];

    CHECK(v, pc_state(&p.core) == PC_PENDING, "zeroed promise not pending");
    CHECK(v, pc_claimed(&p.core) == PC_CLAIM_FREE, "zeroed promise already claimed");
    CHECK(v, !pc_has_waiting_observers(&p.core), "zeroed promise has observers waiting");
    for (unsigned i = 0; i < ORDER_OBSERVERS; i++) {
        observer_init(&obs[i], observer_fire, 0, i);
        order[i] = &obs[i];
        pc_observe(&p.core, &obs[i].node);
        CHECK(v, fired_count(&obs[i]) == 0, "observer #%u fired on a pending promise", i);
    }

    CHECK(v, pc_has_waiting_observers(&p.core), "registered observers are not waiting");
    CHECK(v, pc_claim(&p.core, PC_CLAIM_FREE, PC_FULFILLED), "first claim FREE->FULFILLED lost");
    CHECK(v, !pc_claim(&p.core, PC_CLAIM_FREE, PC_REJECTED), "second claim FREE->REJECTED won");
    CHECK(v, !pc_claim(&p.core, PC_CLAIM_FREE, PC_FULFILLED), "second claim FREE->FULFILLED won");
    CHECK(v, pc_claimed(&p.core) == PC_FULFILLED, "claimed %lu, want FULFILLED",
          (unsigned long)pc_claimed(&p.core));
    /* A claim elects the settler; only pc_publish makes the outcome visible. */
    CHECK(v, pc_state(&p.core) == PC_PENDING, "claimed but unpublished promise not pending");
    CHECK(v, fired_count(&obs[0]) == 0, "an observer fired on claim, before publish");

    p.payload = 0xA11CE;
    pc_publish(&p.core);
    CHECK(v, pc_state(&p.core) == PC_FULFILLED, "state %lu after publish, want FULFILLED",
          (unsigned long)pc_state(&p.core));
    for (unsigned i = 0; i < ORDER_OBSERVERS; i++) {
        check_observer(v, &obs[i], "observer", &p.core, PC_FULFILLED, 0xA11CE);
        if (v->failed) {
            return;
        }
    }
    check_fire_order(v, order, ORDER_OBSERVERS, "registration order");
    if (v->failed) {
        return;
    }
    CHECK(v, !pc_has_waiting_observers(&p.core), "observers still waiting after publish");
    CHECK(v, pc_detach(&p.core) == NULL, "pc_detach on a settled promise returned nodes");
}

/* Set by the test around a pc_observe call: the callback records whether it ran inside. */
static bool inside_observe_call;
static bool fired_inside_observe_call;

static void inline_probe_fire(pc_node *node, pc_promise *source) {
    fired_inside_observe_call = inside_observe_call;
    observer_fire(node, source);
}

/* Observing a settled promise fires the observer at once, before pc_observe returns. */
static void test_observe_after_settle_fires_inline(verdict *v) {
    static const uintptr_t outcomes[] = {PC_FULFILLED, PC_REJECTED, PC_CANCELLED};
    for (unsigned k = 0; k < 3; k++) {
        test_promise p = {0};
        observer early, late;
        observer_init(&early, observer_fire, 0, 0);
        observer_init(&late, inline_probe_fire, 0, 1);
        pc_observe(&p.core, &early.node);
        CHECK(v, settle(&p, PC_CLAIM_FREE, outcomes[k], 100 + k), "claim on a fresh promise lost");
        CHECK(v, pc_state(&p.core) == outcomes[k], "state %lu, want %lu",
              (unsigned long)pc_state(&p.core), (unsigned long)outcomes[k]);

        fired_inside_observe_call = false;
        inside_observe_call = true;
        pc_observe(&p.core, &late.node);
        inside_observe_call = false;
        CHECK(v, fired_count(&late) == 1, "late observer fired %u times by the time pc_observe "
              "returned, want 1", fired_count(&late));
        CHECK(v, fired_inside_observe_call, "late observer did not fire inside pc_observe");
        check_observer(v, &early, "early observer", &p.core, outcomes[k], 100 + k);
        check_observer(v, &late, "late observer", &p.core, outcomes[k], 100 + k);
        if (v->failed) {
            return;
        }
        CHECK(v, early.fire_seq < late.fire_seq, "late observer fired before the early one");
    }
}

/* FREE -> FOLLOWING -> outcome: while following, FREE -> x claims fail. */
static void test_following(verdict *v) {
    test_promise p = {0};
    observer o;
    observer_init(&o, observer_fire, 0, 0);
    pc_observe(&p.core, &o.node);

    CHECK(v, pc_claim(&p.core, PC_CLAIM_FREE, PC_CLAIM_FOLLOWING), "FREE->FOLLOWING lost on a fresh promise");
    CHECK(v, pc_claimed(&p.core) == PC_CLAIM_FOLLOWING, "claimed %lu, want FOLLOWING",
          (unsigned long)pc_claimed(&p.core));
    CHECK(v, !pc_claim(&p.core, PC_CLAIM_FREE, PC_FULFILLED), "FREE->FULFILLED won while following");
    CHECK(v, !pc_claim(&p.core, PC_CLAIM_FREE, PC_REJECTED), "FREE->REJECTED won while following");
    CHECK(v, !pc_claim(&p.core, PC_CLAIM_FREE, PC_CANCELLED), "FREE->CANCELLED won while following");
    CHECK(v, !pc_claim(&p.core, PC_CLAIM_FREE, PC_CLAIM_FOLLOWING), "FREE->FOLLOWING won twice");
    CHECK(v, pc_state(&p.core) == PC_PENDING, "following promise not pending");
    CHECK(v, fired_count(&o) == 0, "observer fired while following");

    CHECK(v, settle(&p, PC_CLAIM_FOLLOWING, PC_REJECTED, 0xBAD), "FOLLOWING->REJECTED lost");
    CHECK(v, !pc_claim(&p.core, PC_CLAIM_FOLLOWING, PC_FULFILLED), "FOLLOWING->x won twice");
    CHECK(v, pc_claimed(&p.core) == PC_REJECTED, "claimed %lu, want REJECTED",
          (unsigned long)pc_claimed(&p.core));
    CHECK(v, pc_state(&p.core) == PC_REJECTED, "state %lu, want REJECTED",
          (unsigned long)pc_state(&p.core));
    check_observer(v, &o, "observer", &p.core, PC_REJECTED, 0xBAD);
}

/* An observer registered from a fire callback of the same promise (the word says FIRING)
 * must queue behind the current batch, not fire itself ahead of it. */
static observer firing_batch[4];
static bool late_fired_inline;

static void register_late_fire(pc_node *node, pc_promise *source) {
    observer_fire(node, source);
    if (source != NULL) {
        pc_observe(source, &firing_batch[3].node);
        late_fired_inline = fired_count(&firing_batch[3]) != 0;
    }
}

static void test_observe_while_firing_joins_next_batch(verdict *v) {
    test_promise p = {0};
    observer_init(&firing_batch[0], register_late_fire, 0, 0);
    for (unsigned i = 1; i < 4; i++) {
        observer_init(&firing_batch[i], observer_fire, 0, i);
    }
    for (unsigned i = 0; i < 3; i++) {
        pc_observe(&p.core, &firing_batch[i].node);
    }
    CHECK(v, settle(&p, PC_CLAIM_FREE, PC_CANCELLED, 7), "claim on a fresh promise lost");
    CHECK(v, !late_fired_inline,
          "observer registered while firing fired inline, ahead of the batch");
    observer *order[4];
    for (unsigned i = 0; i < 4; i++) {
        check_observer(v, &firing_batch[i], "observer", &p.core, PC_CANCELLED, 7);
        if (v->failed) {
            return;
        }
        order[i] = &firing_batch[i];
    }
    check_fire_order(v, order, 4, "batch then late observer");
    if (v->failed) {
        return;
    }
    CHECK(v, pc_detach(&p.core) == NULL, "pc_detach on a settled promise returned nodes");
}

/* pc_detach: the registered nodes of a never-settled promise, none fired; NULL if none. */
static void test_detach(verdict *v) {
    enum { COUNT = 5 };
    test_promise empty = {0};
    CHECK(v, pc_detach(&empty.core) == NULL, "pc_detach on a promise without observers");

    test_promise p = {0};
    observer obs[COUNT];
    for (unsigned i = 0; i < COUNT; i++) {
        observer_init(&obs[i], observer_fire, 0, i);
        pc_observe(&p.core, &obs[i].node);
    }
    /* A claim without publish is still "never settled" for the observers. */
    CHECK(v, pc_claim(&p.core, PC_CLAIM_FREE, PC_CLAIM_FOLLOWING), "FREE->FOLLOWING lost");

    bool seen[COUNT] = {false};
    unsigned found = 0;
    pc_node *node = pc_detach(&p.core);
    /* Bounded walk: a cycle or a stray node fails instead of looping. */
    for (unsigned steps = 0; node != NULL && steps <= COUNT; steps++) {
        ptrdiff_t index = (observer *)(void *)node - obs;
        CHECK(v, index >= 0 && index < COUNT, "pc_detach returned a foreign node %p",
              (void *)node);
        CHECK(v, !seen[index], "pc_detach returned observer #%td twice", index);
        seen[index] = true;
        found += 1;
        node = node->next;
    }
    CHECK(v, found == COUNT && node == NULL, "pc_detach returned %u nodes%s, want %u", found,
          node == NULL ? "" : " and more", COUNT);
    /* It empties the list: a second detach (the owner's own deinit after its links were
     * taken) must not hand the same nodes out twice. */
    CHECK(v, pc_detach(&p.core) == NULL, "a second pc_detach returned the nodes again");
    for (unsigned i = 0; i < COUNT; i++) {
        CHECK(v, fired_count(&obs[i]) == 0 && atomic_load(&obs[i].deferred) == 0,
              "pc_detach fired observer #%u", i);
    }
}

/* ---- 2. trampoline ---------------------------------------------------------------- */

static unsigned callback_depth; /* nesting of test callbacks on this (single) thread */

/* pc_defer outside any fire callback runs the node at once. */
static void test_defer_outside_fire_runs_at_once(verdict *v) {
    observer o;
    observer_init(&o, observer_fire, 0, 0);
    pc_defer(&o.node);
    CHECK(v, atomic_load(&o.deferred) == 1, "deferred %u times by return, want 1",
          atomic_load(&o.deferred));
    pc_defer(&o.node);
    CHECK(v, atomic_load(&o.deferred) == 2, "second defer: %u, want 2", atomic_load(&o.deferred));
    CHECK(v, fired_count(&o) == 0, "pc_defer gave a source != NULL fire");
}

/* A callback that defers itself: the deferred call must come after the callback returned
 * (never nested in it) and before the pc_publish / pc_observe that fired it returns. */
typedef struct {
    observer base;
    bool deferred_ran_nested; /* the deferred call saw its own settle fire still running */
    unsigned deferred_before_return;
} self_deferrer;

static void self_deferrer_fire(pc_node *node, pc_promise *source) {
    self_deferrer *d = (self_deferrer *)(void *)node;
    callback_depth += 1;
    if (source != NULL) {
        observer_record(&d->base, source);
        pc_defer(node);
        d->deferred_before_return = atomic_load(&d->base.deferred);
    } else {
        d->deferred_ran_nested = callback_depth > 1;
        atomic_fetch_add(&d->base.deferred, 1);
    }
    callback_depth -= 1;
}

static void check_self_deferrer(verdict *v, self_deferrer *d, const char *path) {
    CHECK(v, fired_count(&d->base) == 1, "%s: fired %u times, want 1", path,
          fired_count(&d->base));
    CHECK(v, d->deferred_before_return == 0, "%s: pc_defer ran inside the fire callback", path);
    CHECK(v, atomic_load(&d->base.deferred) == 1, "%s: deferred call ran %u times by return, "
          "want 1", path, atomic_load(&d->base.deferred));
    CHECK(v, !d->deferred_ran_nested, "%s: deferred call nested in a fire callback", path);
}

static void test_defer_inside_fire_runs_after_it(verdict *v) {
    test_promise p = {0};
    self_deferrer pending, settled;
    memset(&pending, 0, sizeof pending);
    memset(&settled, 0, sizeof settled);
    observer_init(&pending.base, self_deferrer_fire, 0, 0);
    observer_init(&settled.base, self_deferrer_fire, 0, 1);

    pc_observe(&p.core, &pending.base.node);
    CHECK(v, settle(&p, PC_CLAIM_FREE, PC_FULFILLED, 1), "claim on a fresh promise lost");
    check_self_deferrer(v, &pending, "fired by pc_publish");
    if (v->failed) {
        return;
    }
    pc_observe(&p.core, &settled.base.node);
    check_self_deferrer(v, &settled, "fired by pc_observe");
}

/* pc_keep_until_cascade_end: nothing kept outside a scope; inside one, every kept
 * reference is released after the deferred work, newest first, before the outermost
 * call returns, past the inline buffer too; work a release defers runs before the next
 * release. */
enum { KEEP_COUNT = 100 };

static struct {
    unsigned released[KEEP_COUNT];
    unsigned release_count;
    unsigned deferred_seen; /* deferred runs seen by the first release */
    unsigned deferred_runs;
    bool late_deferral_ran_first; /* the work deferred by release #KEEP_COUNT-1 ran before #KEEP_COUNT-2 */
    pc_node late;
} keeps;

static void keep_deferred_fire(pc_node *node, pc_promise *source) {
    (void)node;
    (void)source;
    keeps.deferred_runs += 1;
}

static void keep_release(void *item) {
    unsigned index = (unsigned)(uintptr_t)item;
    if (keeps.release_count == 0) {
        keeps.deferred_seen = keeps.deferred_runs;
    }
    if (index == KEEP_COUNT - 2) {
        keeps.late_deferral_ran_first = keeps.deferred_runs == 2;
    }
    keeps.released[keeps.release_count++] = index;
    if (index == KEEP_COUNT - 1) {
        keeps.late.fire = keep_deferred_fire;
        pc_defer(&keeps.late); /* inside the drain: runs before the next release */
    }
}

static void keep_all_fire(pc_node *node, pc_promise *source) {
    if (source == NULL) {
        return;
    }
    for (unsigned i = 0; i < KEEP_COUNT; i++) {
        if (!pc_keep_until_cascade_end((void *)(uintptr_t)i, keep_release)) {
            return;
        }
    }
    node->fire = keep_deferred_fire;
    pc_defer(node); /* deferred work: runs before any kept reference is released */
}

static void test_keep_until_cascade_end(verdict *v) {
    memset(&keeps, 0, sizeof keeps);
    CHECK(v, !pc_keep_until_cascade_end((void *)1, keep_release), "kept outside a scope");
    test_promise p = {0};
    observer o;
    observer_init(&o, keep_all_fire, 0, 0);
    pc_observe(&p.core, &o.node);
    CHECK(v, settle(&p, PC_CLAIM_FREE, PC_FULFILLED, 1), "claim on a fresh promise lost");
    CHECK(v, keeps.release_count == KEEP_COUNT, "%u references released by the time pc_publish "
          "returned, want %u", keeps.release_count, (unsigned)KEEP_COUNT);
    CHECK(v, keeps.deferred_seen == 1, "the first release ran before the deferred work");
    for (unsigned i = 0; i < KEEP_COUNT; i++) {
        CHECK(v, keeps.released[i] == KEEP_COUNT - 1 - i, "release #%u was of reference %u, want "
              "newest first", i, keeps.released[i]);
    }
    CHECK(v, keeps.late_deferral_ran_first, "work deferred by a release ran after the next release");
}

/* A thread whose cascade grew the kept buffer to the heap keeps it until it exits; the
 * key's destructor frees it. A destructor of a key created later runs a cascade that keeps
 * past the inline buffer again: it must start from the inline buffer, not write into the
 * freed one (ASan: heap-use-after-free before the fix). */
enum { EXIT_KEEPS = 40 }; /* past PC_KEPT_INLINE */

static unsigned exit_released;
static pthread_key_t exit_late_key;

static void exit_release(void *item) {
    (void)item;
    exit_released += 1;
}

static void exit_keep_fire(pc_node *node, pc_promise *source) {
    (void)node;
    (void)source;
    for (unsigned i = 0; i < EXIT_KEEPS; i++) {
        (void)pc_keep_until_cascade_end((void *)(uintptr_t)(i + 1), exit_release);
    }
}

static void exit_late_destructor(void *value) {
    (void)value;
    pc_node node = {0};
    node.fire = exit_keep_fire;
    pc_defer(&node);
}

static void *exit_thread(void *unused) {
    (void)unused;
    pc_node node = {0};
    node.fire = exit_keep_fire;
    pc_defer(&node); /* grows the kept buffer to the heap, which the thread keeps */
    if (pthread_key_create(&exit_late_key, exit_late_destructor) == 0) {
        (void)pthread_setspecific(exit_late_key, (void *)1); /* destroyed after the kept key's */
    }
    return NULL;
}

static void test_keep_in_a_destructor_at_thread_exit(verdict *v) {
    exit_released = 0;
    pthread_t thread;
    CHECK(v, pthread_create(&thread, NULL, exit_thread, NULL) == 0, "pthread_create");
    pthread_join(thread, NULL);
    (void)pthread_key_delete(exit_late_key);
    CHECK(v, exit_released == 2 * EXIT_KEEPS, "%u references released, want %u", exit_released,
          2u * EXIT_KEEPS);
}

/* pc_inline_begin opens a scope only on a settled, quiescent promise and only outside
 * every scope; what the inline observer defers runs at pc_inline_end, not before. */
static test_promise *inline_probe_target;
static uintptr_t inline_probe_seen;

static void inline_probe_nested_fire(pc_node *node, pc_promise *source) {
    (void)node;
    if (source != NULL) {
        /* inside a firing: the inline path must refuse */
        inline_probe_seen = pc_inline_begin(&inline_probe_target->core);
    }
}

static void test_inline_begin_end(verdict *v) {
    test_promise pending = {0}, settled = {0};
    CHECK(v, pc_inline_begin(&pending.core) == PC_PENDING, "opened on a pending promise");
    CHECK(v, settle(&settled, PC_CLAIM_FREE, PC_FULFILLED, 7), "claim on a fresh promise lost");
    CHECK(v, pc_inline_begin(&settled.core) == PC_FULFILLED, "refused a settled, quiescent promise");
    /* in the scope: a self-deferring observer of another settled promise must wait for
     * pc_inline_end */
    test_promise other = {0};
    CHECK(v, settle(&other, PC_CLAIM_FREE, PC_FULFILLED, 1), "claim on a fresh promise lost");
    self_deferrer d;
    memset(&d, 0, sizeof d);
    observer_init(&d.base, self_deferrer_fire, 0, 0);
    pc_observe(&other.core, &d.base.node);
    CHECK(v, atomic_load(&d.base.deferred) == 0, "deferred work ran inside the inline scope");
    CHECK(v, pc_inline_begin(&settled.core) == PC_PENDING, "opened a scope inside a scope");
    pc_inline_end();
    CHECK(v, atomic_load(&d.base.deferred) == 1, "pc_inline_end did not run the deferred work");
    /* from inside a fire callback: refused */
    test_promise trigger = {0};
    observer o;
    observer_init(&o, inline_probe_nested_fire, 0, 0);
    inline_probe_target = &settled;
    inline_probe_seen = 99;
    pc_observe(&trigger.core, &o.node);
    CHECK(v, settle(&trigger, PC_CLAIM_FREE, PC_FULFILLED, 2), "claim on a fresh promise lost");
    CHECK(v, inline_probe_seen == PC_PENDING, "opened inside a fire callback (got %lu)",
          (unsigned long)inline_probe_seen);
    /* and after everything returned, open again */
    CHECK(v, pc_inline_begin(&settled.core) == PC_FULFILLED, "refused after the scopes closed");
    pc_inline_end();
}

/*
 * A chain of promises: node i observes promise i; its settle fire defers itself, and its
 * deferred call settles promise i + 1. Without the trampoline that is a recursion
 * 100000 levels deep, which overflows the small stack the test runs on.
 */
enum { CHAIN_LENGTH = 100000 };
enum { CHAIN_STACK_SIZE = 256 * 1024 };

typedef struct chain chain;

typedef struct {
    pc_node node; /* first member */
    chain *chain;
    size_t index;
    unsigned fired, deferred;
    unsigned long fire_seq, defer_seq;
    bool right_source, right_payload;
} chain_node;

struct chain {
    test_promise *promises;
    chain_node *nodes;
    size_t length;
    unsigned long clock; /* single thread: plain */
    unsigned depth, max_depth;
    bool started;
};

static void chain_fire(pc_node *node, pc_promise *source) {
    chain_node *n = (chain_node *)(void *)node;
    chain *c = n->chain;
    c->depth += 1;
    if (c->depth > c->max_depth) {
        c->max_depth = c->depth;
    }
    if (source != NULL) {
        n->fired += 1;
        n->fire_seq = c->clock++;
        n->right_source = source == &c->promises[n->index].core;
        n->right_payload = pc_state(source) == PC_FULFILLED &&
                           promise_of(source)->payload == (uint64_t)n->index;
        pc_defer(node);
    } else {
        n->deferred += 1;
        n->defer_seq = c->clock++;
        size_t next = n->index + 1;
        if (next < c->length) {
            settle(&c->promises[next], PC_CLAIM_FREE, PC_FULFILLED, (uint64_t)next);
        }
    }
    c->depth -= 1;
}

static void *chain_run(void *arg) {
    chain *c = arg;
    c->started = true;
    settle(&c->promises[0], PC_CLAIM_FREE, PC_FULFILLED, 0);
    return NULL;
}

static void check_chain(verdict *v, chain *c) {
    CHECK(v, c->started, "chain thread did not run");
    /* deferred call of i -> pc_publish(i + 1) -> settle fire of i + 1: two levels, for
     * every i; recursion would make this grow with the chain. */
    CHECK(v, c->max_depth <= 2, "callbacks nested %u deep, want at most 2", c->max_depth);
    for (size_t i = 0; i < c->length; i++) {
        chain_node *n = &c->nodes[i];
        CHECK(v, n->fired == 1 && n->deferred == 1, "node %zu: %u fires, %u deferred calls, "
              "want 1 and 1", i, n->fired, n->deferred);
        CHECK(v, n->right_source && n->right_payload, "node %zu: wrong source or outcome", i);
        /* Exactly interleaved: fire 0, deferred 0, fire 1, deferred 1, ... */
        CHECK(v, n->fire_seq == 2 * i && n->defer_seq == 2 * i + 1,
              "node %zu ran out of order (fire at %lu, deferred at %lu)", i, n->fire_seq,
              n->defer_seq);
        CHECK(v, pc_state(&c->promises[i].core) == PC_FULFILLED, "promise %zu not fulfilled", i);
    }
}

static void test_chain_on_small_stack(verdict *v) {
    chain c = {0};
    c.length = CHAIN_LENGTH;
    c.promises = calloc(c.length, sizeof *c.promises);
    c.nodes = calloc(c.length, sizeof *c.nodes);
    CHECK(v, c.promises != NULL && c.nodes != NULL, "out of memory");
    for (size_t i = 0; i < c.length; i++) {
        c.nodes[i].node.fire = chain_fire;
        c.nodes[i].chain = &c;
        c.nodes[i].index = i;
        pc_observe(&c.promises[i].core, &c.nodes[i].node);
    }

    pthread_attr_t attr;
    pthread_t thread;
    int error = pthread_attr_init(&attr);
    if (error == 0) {
        error = pthread_attr_setstacksize(&attr, CHAIN_STACK_SIZE);
    }
    if (error == 0) {
        error = pthread_create(&thread, &attr, chain_run, &c);
    }
    if (error == 0) {
        error = pthread_join(thread, NULL);
    }
    pthread_attr_destroy(&attr);
    if (error == 0) {
        check_chain(v, &c);
    } else {
        verdict_fail(v, __LINE__, "thread setup: %s", strerror(error));
    }
    free(c.promises);
    free(c.nodes);
}

/* ---- threads for the stress tests ------------------------------------------------- */

/*
 * A crew: the main thread (participant 0) and size - 1 worker threads that play one
 * round together, between a start and a done barrier. Threads live for the whole test:
 * creating them per round would cost more than the round.
 */
enum { MAX_PARTICIPANTS = 8 };

typedef void (*play_fn)(void *context, unsigned participant, unsigned long round);

typedef struct crew crew;

typedef struct {
    crew *crew;
    unsigned index;
} crew_seat;

struct crew {
    unsigned size;
    play_fn play;
    void *context;
    unsigned long round; /* written by main before the start barrier */
    bool stop;           /* likewise */
    spin_barrier start, done;
    pthread_t threads[MAX_PARTICIPANTS];
    crew_seat seats[MAX_PARTICIPANTS];
};

static void *crew_worker(void *arg) {
    crew_seat *seat = arg;
    crew *c = seat->crew;
    thread_tag = seat->index;
    for (;;) {
        spin_barrier_wait(&c->start);
        if (c->stop) {
            return NULL;
        }
        c->play(c->context, seat->index, c->round);
        spin_barrier_wait(&c->done);
    }
}

static void crew_start(crew *c, unsigned size, play_fn play, void *context) {
    memset(c, 0, sizeof *c);
    c->size = size;
    c->play = play;
    c->context = context;
    spin_barrier_init(&c->start, size);
    spin_barrier_init(&c->done, size);
    for (unsigned i = 1; i < size; i++) {
        c->seats[i] = (crew_seat){c, i};
        int error = pthread_create(&c->threads[i], NULL, crew_worker, &c->seats[i]);
        if (error != 0) {
            fprintf(stderr, "core_test: pthread_create: %s\n", strerror(error));
            exit(2); /* the barriers now wait for a thread that does not exist */
        }
    }
}

static void crew_play_round(crew *c, unsigned long round) {
    c->round = round;
    spin_barrier_wait(&c->start);
    c->play(c->context, 0, round);
    spin_barrier_wait(&c->done);
}

static void crew_finish(crew *c) {
    c->stop = true;
    spin_barrier_wait(&c->start);
    for (unsigned i = 1; i < c->size; i++) {
        pthread_join(c->threads[i], NULL);
    }
}

/* ---- stress configuration --------------------------------------------------------- */

enum { MIN_STRESS_ROUNDS = 10 };

static unsigned long env_rounds;   /* 0: each test's default */
static double env_seconds;         /* 0: no cap */

static double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void read_environment(void) {
    const char *text = getenv("PROMISE_STRESS_ITERATIONS");
    if (text != NULL && *text != '\0') {
        char *end;
        errno = 0;
        unsigned long value = strtoul(text, &end, 10);
        if (errno != 0 || *end != '\0' || value == 0 || text[0] == '-') {
            fprintf(stderr, "core_test: PROMISE_STRESS_ITERATIONS=%s: want a positive integer\n",
                    text);
            exit(2);
        }
        env_rounds = value;
    }
    text = getenv("PROMISE_STRESS_SECONDS");
    if (text != NULL && *text != '\0') {
        char *end;
        double value = strtod(text, &end);
        if (*end != '\0' || !(value > 0)) {
            fprintf(stderr, "core_test: PROMISE_STRESS_SECONDS=%s: want a positive number\n",
                    text);
            exit(2);
        }
        env_seconds = value;
    }
}

/*
 * One stress test: `prepare` resets the shared state (main thread, crew parked), the
 * crew plays the round, `check` inspects it (crew parked again). Stops at the first
 * failed round, after `rounds`, or when the wall-clock cap is exceeded.
 */
typedef struct {
    const char *name;
    unsigned participants;
    unsigned long default_rounds;
    void (*prepare)(void *context, unsigned long round);
    play_fn play;
    void (*check)(void *context, unsigned long round, verdict *v);
    void (*summary)(void *context, unsigned long rounds); /* prints '#' diagnostics */
} stress_test;

static void run_stress(const stress_test *test, void *context) {
    unsigned long rounds = env_rounds != 0 ? env_rounds : test->default_rounds;
    verdict v = {0};
    crew c;
    crew_start(&c, test->participants, test->play, context);
    double started = now_seconds();
    unsigned long round = 0;
    while (round < rounds) {
        test->prepare(context, round);
        crew_play_round(&c, round);
        test->check(context, round, &v);
        if (v.failed) {
            v.in_round = true;
            v.round = round;
            round += 1;
            break;
        }
        round += 1;
        if (env_seconds > 0 && round >= MIN_STRESS_ROUNDS && now_seconds() - started > env_seconds) {
            break;
        }
    }
    crew_finish(&c);
    double elapsed = now_seconds() - started;
    printf("# %s: %lu of %lu rounds in %.2f s\n", test->name, round, rounds, elapsed);
    test->summary(context, round);
    report(test->name, &v, round);
}

/* Payloads name the round, the outcome and the thread, so a stale or foreign value shows. */
static uint64_t make_payload(unsigned long round, uintptr_t outcome, unsigned participant) {
    return ((uint64_t)round << 16) | ((uint64_t)outcome << 8) | participant;
}

/* ---- 3. racing settlers ----------------------------------------------------------- */

enum { SETTLERS = 4 };

typedef struct {
    bool won;
    uintptr_t seen_state;  /* a loser's pc_state right after losing */
    uint64_t seen_payload; /* and the payload, when that state was settled */
} settler_seat;

typedef struct {
    test_promise promise;
    observer early;  /* registered before the round: fired by the winner */
    observer late;   /* registered by participant 0 after its claim: races the publish */
    settler_seat seats[SETTLERS];
    unsigned long wins[SETTLERS];
    unsigned long losers_saw_settled, losers_saw_pending;
} settlers_context;

/* Outcomes rotate so that every thread tries every outcome. */
static uintptr_t settler_outcome(unsigned participant, unsigned long round) {
    return PC_FULFILLED + (uintptr_t)((participant + round) % 3);
}

static void settlers_prepare(void *context, unsigned long round) {
    settlers_context *s = context;
    (void)round;
    memset(&s->promise, 0, sizeof s->promise);
    memset(s->seats, 0, sizeof s->seats);
    observer_init(&s->early, observer_fire, 0, 0);
    observer_init(&s->late, observer_fire, 0, 1);
    pc_observe(&s->promise.core, &s->early.node);
}

static void settlers_play(void *context, unsigned me, unsigned long round) {
    settlers_context *s = context;
    settler_seat *seat = &s->seats[me];
    uintptr_t outcome = settler_outcome(me, round);
    seat->won = settle(&s->promise, PC_CLAIM_FREE, outcome, make_payload(round, outcome, me));
    if (me == 0) {
        /* Before this thread's own pc_state: an inline fire must rely on pc_observe's
         * acquire alone to see the winner's payload. */
        pc_observe(&s->promise.core, &s->late.node);
    }
    if (!seat->won) {
        /* acquire: a settled state makes the winner's payload visible here */
        seat->seen_state = pc_state(&s->promise.core);
        if (seat->seen_state != PC_PENDING) {
            seat->seen_payload = s->promise.payload;
        }
    }
}

static void settlers_check(void *context, unsigned long round, verdict *v) {
    settlers_context *s = context;
    unsigned winner = SETTLERS;
    for (unsigned i = 0; i < SETTLERS; i++) {
        if (s->seats[i].won) {
            CHECK(v, winner == SETTLERS, "threads %u and %u both won the claim", winner, i);
            winner = i;
        }
    }
    CHECK(v, winner < SETTLERS, "no thread won the claim");
    s->wins[winner] += 1;

    uintptr_t outcome = settler_outcome(winner, round);
    uint64_t payload = make_payload(round, outcome, winner);
    CHECK(v, pc_claimed(&s->promise.core) == outcome, "claim word %lu, winner's outcome %lu",
          (unsigned long)pc_claimed(&s->promise.core), (unsigned long)outcome);
    CHECK(v, pc_state(&s->promise.core) == outcome, "state %lu, winner's outcome %lu",
          (unsigned long)pc_state(&s->promise.core), (unsigned long)outcome);
    CHECK(v, s->promise.payload == payload, "payload overwritten by a loser");
    check_observer(v, &s->early, "observer registered before", &s->promise.core, outcome,
                   payload);
    check_observer(v, &s->late, "observer registered during", &s->promise.core, outcome,
                   payload);
    if (v->failed) {
        return;
    }
    for (unsigned i = 0; i < SETTLERS; i++) {
        settler_seat *seat = &s->seats[i];
        if (i == winner) {
            continue;
        }
        if (seat->seen_state == PC_PENDING) {
            s->losers_saw_pending += 1;
            continue;
        }
        s->losers_saw_settled += 1;
        CHECK(v, seat->seen_state == outcome && seat->seen_payload == payload,
              "loser %u saw state %lu payload %#llx, winner published %lu %#llx", i,
              (unsigned long)seat->seen_state, (unsigned long long)seat->seen_payload,
              (unsigned long)outcome, (unsigned long long)payload);
    }
    CHECK(v, pc_detach(&s->promise.core) == NULL, "pc_detach on the settled promise");
}

static void settlers_summary(void *context, unsigned long rounds) {
    settlers_context *s = context;
    (void)rounds;
    printf("# wins per thread:");
    for (unsigned i = 0; i < SETTLERS; i++) {
        printf(" %lu", s->wins[i]);
    }
    printf("; losers saw pending %lu, settled %lu times\n", s->losers_saw_pending,
           s->losers_saw_settled);
}

/* ---- 4. registration racing the settle -------------------------------------------- */

enum { REGISTRARS = 3, PER_REGISTRAR = 32 };

typedef struct {
    test_promise promise;
    observer observers[REGISTRARS][PER_REGISTRAR];
    bool settled;
    atomic_ulong settler_fires; /* fires on the settler's thread this round */
    unsigned long fired_by_settler, fired_inline, late_batch, mixed_rounds;
} race_context;

static race_context *race; /* for the fire callback, which only gets the node */

/* Registrars are participants 1..REGISTRARS; participant 0 (main) settles. */
static void race_fire(pc_node *node, pc_promise *source) {
    observer_fire(node, source);
    if (source != NULL && thread_tag == 0) {
        atomic_fetch_add_explicit(&race->settler_fires, 1, memory_order_relaxed);
        spin_for(20); /* widen the firing window, so registrations land in it */
    }
}

static uintptr_t race_outcome(unsigned long round) {
    return PC_FULFILLED + (uintptr_t)(round % 3);
}

static void race_prepare(void *context, unsigned long round) {
    race_context *r = context;
    (void)round;
    memset(&r->promise, 0, sizeof r->promise);
    r->settled = false;
    atomic_store(&r->settler_fires, 0);
    for (unsigned g = 0; g < REGISTRARS; g++) {
        for (unsigned i = 0; i < PER_REGISTRAR; i++) {
            observer_init(&r->observers[g][i], race_fire, g + 1, i);
        }
    }
}

static void race_play(void *context, unsigned me, unsigned long round) {
    race_context *r = context;
    if (me == 0) {
        /* Vary when the settle lands: before, among or after the registrations. */
        spin_for((unsigned)(round * 37 % 400));
        uintptr_t outcome = race_outcome(round);
        r->settled = settle(&r->promise, PC_CLAIM_FREE, outcome, make_payload(round, outcome, 0));
        return;
    }
    observer *mine = r->observers[me - 1];
    for (unsigned i = 0; i < PER_REGISTRAR; i++) {
        mine[i].settler_had_fired =
            atomic_load_explicit(&r->settler_fires, memory_order_relaxed) != 0;
        pc_observe(&r->promise.core, &mine[i].node);
    }
}

static void race_check(void *context, unsigned long round, verdict *v) {
    race_context *r = context;
    uintptr_t outcome = race_outcome(round);
    uint64_t payload = make_payload(round, outcome, 0);
    CHECK(v, r->settled, "the only claim lost");
    CHECK(v, pc_state(&r->promise.core) == outcome, "state %lu, want %lu",
          (unsigned long)pc_state(&r->promise.core), (unsigned long)outcome);
    unsigned long by_settler = 0, inline_fires = 0;
    for (unsigned g = 0; g < REGISTRARS; g++) {
        observer *order[PER_REGISTRAR];
        for (unsigned i = 0; i < PER_REGISTRAR; i++) {
            observer *o = &r->observers[g][i];
            check_observer(v, o, "observer", &r->promise.core, outcome, payload);
            if (v->failed) {
                return;
            }
            order[i] = o;
            if (o->fired_by == 0) {
                by_settler += 1;
                /* The settler had taken a batch before this registration began, and
                 * still fired it: it was pushed while the word said FIRING. */
                r->late_batch += o->settler_had_fired;
            } else {
                CHECK(v, o->fired_by == g + 1, "observer of registrar %u fired on thread %u",
                      g + 1, o->fired_by);
                inline_fires += 1;
            }
        }
        char what[64];
        snprintf(what, sizeof what, "registrar %u order", g + 1);
        check_fire_order(v, order, PER_REGISTRAR, what);
        if (v->failed) {
            return;
        }
    }
    CHECK(v, pc_detach(&r->promise.core) == NULL, "pc_detach on the settled promise");
    r->fired_by_settler += by_settler;
    r->fired_inline += inline_fires;
    r->mixed_rounds += by_settler != 0 && inline_fires != 0;
}

static void race_summary(void *context, unsigned long rounds) {
    race_context *r = context;
    (void)rounds;
    printf("# fired by the settler %lu (of which pushed while firing: %lu), inline %lu; "
           "rounds with both: %lu\n",
           r->fired_by_settler, r->late_batch, r->fired_inline, r->mixed_rounds);
}

/* ---- 5. pruning: observers that gave up leave a pending promise ------------------- */

/* A node gives up by setting its flag; a prune drops it (the callback owns it then). */
typedef struct {
    observer base;         /* first member */
    atomic_bool gave_up;
    atomic_uint dropped;
} prunable;

static bool prunable_gave_up(pc_node *node, void *context) {
    (void)context;
    return atomic_load(&((prunable *)(void *)node)->gave_up);
}

static void prunable_release(pc_node *node, void *context) {
    (void)context;
    atomic_fetch_add(&((prunable *)(void *)node)->dropped, 1);
}

static void prunable_init(prunable *o, unsigned registrar, unsigned seq) {
    observer_init(&o->base, observer_fire, registrar, seq);
    atomic_init(&o->gave_up, false);
    atomic_init(&o->dropped, 0);
}

/* One thread: a prune drops the nodes that gave up, keeps the others in their order,
 * and counts them; nodes registered later join above; the settle fires the kept ones in
 * registration order. A prune of a settled promise does nothing. */
static void test_prune_in_order(verdict *v) {
    enum { N = 16 };
    test_promise p = {0};
    prunable obs[N];
    size_t kept = 99;
    CHECK(v, pc_prune(&p.core, prunable_gave_up, prunable_release, NULL, &kept) && kept == 0,
          "pruning an empty pending promise: want true and 0 kept, got %zu", kept);
    for (unsigned i = 0; i < N; i++) {
        prunable_init(&obs[i], 0, i);
        if (i < N / 2) {
            pc_observe(&p.core, &obs[i].base.node);
            atomic_store(&obs[i].gave_up, i % 3 == 0);
        }
    }
    CHECK(v, pc_prune(&p.core, prunable_gave_up, prunable_release, NULL, &kept), "prune of a pending promise refused");
    CHECK(v, kept == 5, "kept %zu nodes, want 5", kept);
    for (unsigned i = N / 2; i < N; i++) {
        pc_observe(&p.core, &obs[i].base.node);
    }
    CHECK(v, settle(&p, PC_CLAIM_FREE, PC_REJECTED, 0xBEEF), "claim lost");
    observer *order[N];
    size_t fired = 0;
    for (unsigned i = 0; i < N; i++) {
        bool dropped = i < N / 2 && i % 3 == 0;
        CHECK(v, atomic_load(&obs[i].dropped) == (dropped ? 1u : 0u), "node #%u dropped %u times", i,
              atomic_load(&obs[i].dropped));
        if (dropped) {
            CHECK(v, fired_count(&obs[i].base) == 0, "dropped node #%u fired", i);
            continue;
        }
        check_observer(v, &obs[i].base, "kept node", &p.core, PC_REJECTED, 0xBEEF);
        if (v->failed) {
            return;
        }
        order[fired++] = &obs[i].base;
    }
    check_fire_order(v, order, fired, "kept nodes");
    if (v->failed) {
        return;
    }
    CHECK(v, !pc_prune(&p.core, prunable_gave_up, prunable_release, NULL, &kept), "prune of a settled promise ran");
}

/* Registrations, give-ups, prunes and the settle at once: every node that did not give
 * up fires once, each registrar's in order; a node that gave up is dropped once or fires
 * once, never both; every observer fires on the settler's thread or, registered after the
 * settle, on its registrar's: never on the pruner's (a publisher that meets a prune waits
 * for the nodes to come back and fires them itself). */
enum { PRUNE_REGISTRARS = 2, PRUNE_PER_REGISTRAR = 24 };

typedef struct {
    test_promise promise;
    prunable observers[PRUNE_REGISTRARS][PRUNE_PER_REGISTRAR];
    bool settled;
    atomic_uint registrars_done;
    atomic_uint prunes_after_registrations; /* prunes begun once every registrar was done */
    unsigned long prunes, dropped, fired_by_settler;
} prune_context;

static void prune_prepare(void *context, unsigned long round) {
    prune_context *r = context;
    (void)round;
    memset(&r->promise, 0, sizeof r->promise);
    r->settled = false;
    atomic_store(&r->registrars_done, 0);
    atomic_store(&r->prunes_after_registrations, 0);
    for (unsigned g = 0; g < PRUNE_REGISTRARS; g++) {
        for (unsigned i = 0; i < PRUNE_PER_REGISTRAR; i++) {
            prunable_init(&r->observers[g][i], g + 1, i);
        }
    }
}

/* Participant 0 settles, 1 prunes until the promise settled, the others register. */
static void prune_play(void *context, unsigned me, unsigned long round) {
    prune_context *r = context;
    if (me == 0) {
        /* Every other round, once a prune began after the registrations (and their
         * give-ups) were done, so prunes drop nodes; yielding, as the crew outnumbers the
         * cores. */
        while (round % 2 == 0 && atomic_load(&r->prunes_after_registrations) == 0) {
            sched_yield();
        }
        spin_for((unsigned)(round * 53 % 600));
        uintptr_t outcome = race_outcome(round);
        r->settled = settle(&r->promise, PC_CLAIM_FREE, outcome, make_payload(round, outcome, 0));
        return;
    }
    if (me == 1) {
        size_t kept;
        for (;;) {
            bool pending = pc_state(&r->promise.core) == PC_PENDING;
            bool after = atomic_load(&r->registrars_done) == PRUNE_REGISTRARS;
            if (pc_prune(&r->promise.core, prunable_gave_up, prunable_release, NULL, &kept)) {
                r->prunes += 1;
                if (after) {
                    atomic_fetch_add(&r->prunes_after_registrations, 1);
                }
            } else if (!pending) {
                return;
            }
        }
    }
    prunable *mine = r->observers[me - 2];
    for (unsigned i = 0; i < PRUNE_PER_REGISTRAR; i++) {
        pc_observe(&r->promise.core, &mine[i].base.node);
        if (i % 2 == 1) {
            atomic_store(&mine[i].gave_up, true); /* may race with its firing: fine */
        }
    }
    atomic_fetch_add(&r->registrars_done, 1);
}

static void prune_check(void *context, unsigned long round, verdict *v) {
    prune_context *r = context;
    uintptr_t outcome = race_outcome(round);
    uint64_t payload = make_payload(round, outcome, 0);
    CHECK(v, r->settled, "the only claim lost");
    CHECK(v, pc_state(&r->promise.core) == outcome, "state %lu, want %lu",
          (unsigned long)pc_state(&r->promise.core), (unsigned long)outcome);
    for (unsigned g = 0; g < PRUNE_REGISTRARS; g++) {
        observer *order[PRUNE_PER_REGISTRAR];
        size_t fired = 0;
        for (unsigned i = 0; i < PRUNE_PER_REGISTRAR; i++) {
            prunable *o = &r->observers[g][i];
            unsigned dropped = atomic_load(&o->dropped);
            CHECK(v, dropped <= 1 && (dropped == 0 || i % 2 == 1),
                  "registrar %u node #%u dropped %u times (gave up: %d)", g + 1, i, dropped, i % 2 == 1);
            if (dropped == 1) {
                CHECK(v, fired_count(&o->base) == 0, "registrar %u node #%u dropped and fired", g + 1, i);
                r->dropped += 1;
                continue;
            }
            check_observer(v, &o->base, "observer", &r->promise.core, outcome, payload);
            if (v->failed) {
                return;
            }
            CHECK(v, o->base.fired_by != 1, "registrar %u node #%u fired on the pruner's thread", g + 1, i);
            r->fired_by_settler += o->base.fired_by == 0;
            order[fired++] = &o->base;
        }
        char what[64];
        snprintf(what, sizeof what, "registrar %u order", g + 1);
        check_fire_order(v, order, fired, what);
        if (v->failed) {
            return;
        }
    }
    CHECK(v, pc_detach(&r->promise.core) == NULL, "pc_detach on the settled promise");
}

static void prune_summary(void *context, unsigned long rounds) {
    prune_context *r = context;
    (void)rounds;
    printf("# prunes %lu, nodes dropped %lu, observers fired by the settler %lu\n",
           r->prunes, r->dropped, r->fired_by_settler);
}

/* ---- the forwarding epoch ---------------------------------------------------------- */

/* What a reader relies on: a begin marks a forward in progress, an end clears it and
 * moves the epoch, so a value read before a forward never equals one read after it; and
 * forwards racing on several threads end quiet, with the epoch moved once per forward. */
enum { FORWARD_THREADS = 4, FORWARDS_PER_THREAD = 20000 };

static void *forward_many(void *unused) {
    (void)unused;
    for (int i = 0; i < FORWARDS_PER_THREAD; i++) {
        pc_forwarding_begin();
        pc_forwarding_end();
    }
    return NULL;
}

/* The epoch stops at its largest value instead of wrapping back to one a parent may have
 * recorded (4,096 forwards on 32-bit targets before): there it is never quiet, and begins
 * and ends still balance. The word is set by hand near the end and restored after. */
static void test_forwarding_epoch_saturates(verdict *v) {
    uintptr_t saved = pc_forwarding_epoch();
    const uintptr_t largest = ~(uintptr_t)PC_FORWARDING_ACTIVE_MASK;
    __atomic_store_n(&pc_forwarding_word, largest - PC_FORWARDING_EPOCH_ONE, __ATOMIC_SEQ_CST);
    CHECK(v, pc_forwarding_is_quiet(pc_forwarding_epoch()), "one epoch before the largest is quiet");
    pc_forwarding_begin();
    CHECK(v, !pc_forwarding_is_quiet(pc_forwarding_epoch()), "a forward in progress is not quiet");
    pc_forwarding_end();
    uintptr_t reached = pc_forwarding_epoch();
    CHECK(v, reached == (largest | 1u), "the end that reaches the largest epoch keeps its count: 0x%lx",
          (unsigned long)reached);
    CHECK(v, !pc_forwarding_is_quiet(reached), "the largest epoch is never quiet");
    for (int i = 0; i < 3; i++) {
        pc_forwarding_begin();
        pc_forwarding_begin();
        CHECK(v, (pc_forwarding_epoch() & PC_FORWARDING_ACTIVE_MASK) == 3, "two in progress, one kept");
        pc_forwarding_end();
        pc_forwarding_end();
    }
    uintptr_t after = pc_forwarding_epoch();
    CHECK(v, after == (largest | 1u), "forwards past it leave it there, balanced: 0x%lx", (unsigned long)after);
    __atomic_store_n(&pc_forwarding_word, saved, __ATOMIC_SEQ_CST);
}

static void test_forwarding_epoch(verdict *v) {
    uintptr_t before = pc_forwarding_epoch();
    CHECK(v, (before & PC_FORWARDING_ACTIVE_MASK) == 0, "quiet at the start: 0x%lx", (unsigned long)before);
    pc_forwarding_begin();
    uintptr_t during = pc_forwarding_epoch();
    CHECK(v, (during & PC_FORWARDING_ACTIVE_MASK) == 1, "one forward in progress: 0x%lx", (unsigned long)during);
    CHECK(v, during != before, "a begin changes the word");
    pc_forwarding_begin();
    pc_forwarding_end();
    uintptr_t nested = pc_forwarding_epoch();
    CHECK(v, (nested & PC_FORWARDING_ACTIVE_MASK) == 1, "still one in progress: 0x%lx", (unsigned long)nested);
    CHECK(v, nested != during, "an end changes the word even while another forward runs");
    pc_forwarding_end();
    uintptr_t after = pc_forwarding_epoch();
    CHECK(v, (after & PC_FORWARDING_ACTIVE_MASK) == 0, "quiet again: 0x%lx", (unsigned long)after);
    CHECK(v, after - before == 2 * (uintptr_t)PC_FORWARDING_EPOCH_ONE, "two ends, two epochs");

    pthread_t threads[FORWARD_THREADS];
    for (int t = 0; t < FORWARD_THREADS; t++) {
        CHECK(v, pthread_create(&threads[t], NULL, forward_many, NULL) == 0, "pthread_create");
    }
    for (int t = 0; t < FORWARD_THREADS; t++) {
        pthread_join(threads[t], NULL);
    }
    uintptr_t raced = pc_forwarding_epoch();
    CHECK(v, (raced & PC_FORWARDING_ACTIVE_MASK) == 0, "racing forwards end quiet: 0x%lx", (unsigned long)raced);
    CHECK(v, raced - after == (uintptr_t)FORWARD_THREADS * FORWARDS_PER_THREAD * PC_FORWARDING_EPOCH_ONE,
          "one epoch per forward");
}

/* ---- 5. locked words: readers never touch a freed target -------------------------- */

/*
 * The overlay's protocol for references that do not keep their target alive, played with
 * a C reference count: the target starts with one reference (the owner's); readers load
 * the word, lock it, try to take a reference (a CAS that fails at zero, like
 * swift_tryRetain), unlock, use the target and drop their reference. Whoever drops the last
 * reference finishes the target: clears the word under its lock, then marks the target
 * dead. Dead targets are kept until the check (a quarantine instead of free), so a reader
 * that touches one sees DEAD instead of undefined behaviour (the check frees it).
 */
enum { WORD_READERS = 3, TARGET_LIVE = 0x11fe, TARGET_DEAD = 0xdead };

typedef struct {
    atomic_uint references;
    atomic_uint magic;
} word_target;

typedef struct {
    uintptr_t word;
    word_target *target;          /* this round's, for the check */
    unsigned long tries[WORD_READERS + 1], successes[WORD_READERS + 1];
    unsigned long touched_dead[WORD_READERS + 1]; /* per thread: no shared counter to race on */
    unsigned long finished_by_reader;
    bool finished_by[WORD_READERS + 1];
} word_context;

static void word_finish(word_context *w, word_target *t, unsigned me) {
    uintptr_t seen = pc_word_lock(&w->word);
    pc_word_unlock(&w->word, seen == (uintptr_t)t ? 0 : seen);
    /* relaxed: the word's lock orders this after every reader's try on the target */
    atomic_store_explicit(&t->magic, TARGET_DEAD, memory_order_relaxed);
    w->finished_by[me] = true;
}

static void word_release(word_context *w, word_target *t, unsigned me) {
    /* acq_rel: the last release sees every earlier holder's use of the target */
    if (atomic_fetch_sub_explicit(&t->references, 1, memory_order_acq_rel) == 1) {
        word_finish(w, t, me);
    }
}

static void word_prepare(void *context, unsigned long round) {
    word_context *w = context;
    (void)round;
    word_target *t = malloc(sizeof *t);
    if (t == NULL) {
        abort();
    }
    atomic_init(&t->references, 1);
    atomic_init(&t->magic, TARGET_LIVE);
    w->target = t;
    memset(w->finished_by, 0, sizeof w->finished_by);
    pc_word_store(&w->word, (uintptr_t)t); /* before the crew starts: no reader yet */
}

static void word_play(void *context, unsigned me, unsigned long round) {
    word_context *w = context;
    if (me == 0) {
        spin_for((unsigned)(round * 53 % 3000)); /* vary where the owner's release lands */
        word_release(w, w->target, 0);
        return;
    }
    for (unsigned attempt = 0; attempt < 200; attempt++) {
        uintptr_t seen = pc_word_load(&w->word) & ~(uintptr_t)PC_WORD_LOCKED;
        if (seen == 0) {
            return; /* cleared: the target is finished or about to be */
        }
        word_target *t = (word_target *)pc_word_lock(&w->word);
        bool taken = false;
        if (t != NULL) {
            w->tries[me] += 1;
            w->touched_dead[me] += atomic_load_explicit(&t->magic, memory_order_relaxed) != TARGET_LIVE;
            unsigned count = atomic_load_explicit(&t->references, memory_order_relaxed);
            while (count != 0 && !taken) {
                taken = atomic_compare_exchange_weak_explicit(&t->references, &count, count + 1,
                                                              memory_order_relaxed, memory_order_relaxed);
            }
        }
        pc_word_unlock(&w->word, (uintptr_t)t);
        if (taken) {
            w->successes[me] += 1;
            w->touched_dead[me] += atomic_load_explicit(&t->magic, memory_order_relaxed) != TARGET_LIVE;
            word_release(w, t, me);
        }
    }
}

static void word_check(void *context, unsigned long round, verdict *v) {
    word_context *w = context;
    (void)round;
    word_target *t = w->target;
    unsigned long touched_dead = 0;
    for (unsigned i = 1; i <= WORD_READERS; i++) {
        touched_dead += w->touched_dead[i];
    }
    CHECK(v, touched_dead == 0, "a reader touched a finished target (%lu times)", touched_dead);
    CHECK(v, w->word == 0, "the finished target's word was not cleared");
    CHECK(v, atomic_load(&t->references) == 0 && atomic_load(&t->magic) == TARGET_DEAD,
          "target not finished: %u references", atomic_load(&t->references));
    unsigned finishers = 0;
    for (unsigned i = 0; i <= WORD_READERS; i++) {
        finishers += w->finished_by[i];
    }
    CHECK(v, finishers == 1, "%u threads finished the target", finishers);
    w->finished_by_reader += !w->finished_by[0];
    free(t);
}

static void word_summary(void *context, unsigned long rounds) {
    word_context *w = context;
    (void)rounds;
    unsigned long tries = 0, successes = 0;
    for (unsigned i = 1; i <= WORD_READERS; i++) {
        tries += w->tries[i];
        successes += w->successes[i];
    }
    printf("# reader tries %lu, took a reference %lu, found it dying %lu; rounds finished by a "
           "reader %lu\n", tries, successes, tries - successes, w->finished_by_reader);
}

/* ---- 6. the aggregate's retirement gate ------------------------------------------ */

/* The cascade watch: only the watched promise's inline fires count, and watches nest. */
static void test_cascade_watch(verdict *v) {
    static pc_promise outer, inner, other;
    uintptr_t none = pc_cascade_watch(&outer);
    CHECK(v, none == 0, "nothing watched at first");
    pc_cascade_fired_inline(&other);
    uintptr_t saved = pc_cascade_watch(&inner);
    CHECK(v, saved == (uintptr_t)&outer, "a nested watch saves the outer one, not fired");
    pc_cascade_fired_inline(&inner);
    CHECK(v, pc_cascade_watch_end(saved), "the inner promise fired inline");
    CHECK(v, !pc_cascade_watch_end(none), "another promise's fire does not count");

    (void)pc_cascade_watch(&outer);
    pc_cascade_fired_inline(&outer); /* the outer fires before a nested watch starts */
    saved = pc_cascade_watch(&inner);
    CHECK(v, !pc_cascade_watch_end(saved), "the inner promise did not fire");
    CHECK(v, pc_cascade_watch_end(0), "the outer one's fire survives the nested watch");

    /* The reference on offer goes to the first child that takes, once. */
    none = pc_cascade_watch_offering(&outer);
    pc_cascade_fired_inline(&outer); /* a plain fire counts, but takes nothing */
    CHECK(v, !pc_cascade_fired_inline_taking(&other), "another promise's child takes nothing");
    CHECK(v, pc_cascade_fired_inline_taking(&outer), "the first child takes the reference");
    CHECK(v, !pc_cascade_fired_inline_taking(&outer), "a second child takes nothing");
    CHECK(v, pc_cascade_watch_end(none) == PC_WATCH_FIRED, "the frame sees it fired and taken");
    none = pc_cascade_watch_offering(&outer);
    saved = pc_cascade_watch(&inner);
    CHECK(v, !pc_cascade_fired_inline_taking(&inner), "a plain watch offers nothing");
    CHECK(v, pc_cascade_watch_end(saved) == PC_WATCH_FIRED, "but counts the fire");
    CHECK(v, pc_cascade_watch_end(none) == PC_WATCH_OFFERED, "the outer offer survives, untaken");
}

/* pc_scope_opened_by: true, while the scope is open, only for the promise whose call
 * (pc_publish, pc_observe) opened the thread's outermost scope; not for a promise settled
 * inside it, nor in pc_inline_begin's scope or a bare pc_defer's drain, nor after the
 * call returned. */
static struct {
    test_promise outer, inner;
    pc_node outer_node, inner_node, late_node, bare_node;
    bool outer_in_fire, other_in_fire, inner_in_nested, outer_in_nested, outer_in_late,
        any_in_bare;
} opener;

static void opener_inner_fire(pc_node *node, pc_promise *source) {
    (void)node;
    if (source != NULL) {
        opener.inner_in_nested = pc_scope_opened_by(&opener.inner.core);
        opener.outer_in_nested = pc_scope_opened_by(&opener.outer.core);
    }
}

static void opener_outer_fire(pc_node *node, pc_promise *source) {
    (void)node;
    if (source != NULL) {
        opener.outer_in_fire = pc_scope_opened_by(&opener.outer.core);
        opener.other_in_fire = pc_scope_opened_by(&opener.inner.core);
        (void)settle(&opener.inner, PC_CLAIM_FREE, PC_FULFILLED, 2); /* a nested publish */
    }
}

static void opener_late_fire(pc_node *node, pc_promise *source) {
    (void)node;
    if (source != NULL) {
        opener.outer_in_late = pc_scope_opened_by(&opener.outer.core);
    }
}

static void opener_bare_fire(pc_node *node, pc_promise *source) {
    (void)node;
    (void)source;
    opener.any_in_bare = pc_scope_opened_by(&opener.outer.core) || pc_scope_opened_by(&opener.inner.core);
}

static void test_scope_opener(verdict *v) {
    memset(&opener, 0, sizeof opener);
    opener.outer_node.fire = opener_outer_fire;
    opener.inner_node.fire = opener_inner_fire;
    opener.late_node.fire = opener_late_fire;
    opener.bare_node.fire = opener_bare_fire;
    CHECK(v, !pc_scope_opened_by(&opener.outer.core), "no scope open at first");
    pc_observe(&opener.outer.core, &opener.outer_node);
    pc_observe(&opener.inner.core, &opener.inner_node);
    CHECK(v, settle(&opener.outer, PC_CLAIM_FREE, PC_FULFILLED, 1), "claim on a fresh promise lost");
    CHECK(v, opener.outer_in_fire, "the settled promise opened the scope of its own publish");
    CHECK(v, !opener.other_in_fire, "another promise did not open it");
    CHECK(v, !opener.inner_in_nested, "a promise settled inside the scope did not open it");
    CHECK(v, opener.outer_in_nested, "the outer promise's scope is still the one open");
    CHECK(v, !pc_scope_opened_by(&opener.outer.core), "the scope closed with the call");
    pc_observe(&opener.outer.core, &opener.late_node); /* fires at once: pc_observe opens it */
    CHECK(v, opener.outer_in_late, "a registration on a settled promise opens its scope");
    CHECK(v, pc_inline_begin(&opener.outer.core) == PC_FULFILLED, "an inline observation of the settled promise");
    CHECK(v, !pc_scope_opened_by(&opener.outer.core), "pc_inline_begin's scope records no opener");
    pc_inline_end();
    pc_defer(&opener.bare_node);
    CHECK(v, !opener.any_in_bare, "a bare pc_defer's drain has no opener");
    CHECK(v, !pc_scope_opened_by(&opener.outer.core), "and nothing is left open");
}

/* ---- calls into a user's execution context ------------------------------------------ */

/* A chain of "handlers" on a context that runs work inside its execute call: each handler
 * calls the context for the next, as the overlay does (ContextCalls.execute): it first
 * asks whether it is too deep, and queues the call if so. */
static struct {
    unsigned ran[64];
    unsigned depth_of[64];
    unsigned count;
} context_chain;

static void context_call(void *item);

/* The handler of `step`: records it and the calls it runs inside, then calls the context
 * for the next. */
static void context_handler(unsigned step) {
    context_chain.ran[context_chain.count] = step;
    context_chain.depth_of[context_chain.count++] = pc_context_call_depth;
    if (step + 1 < 64) {
        context_call((void *)(uintptr_t)(step + 2)); /* +1: not NULL; the next step */
    }
}

/* ContextCalls.execute for the handler of step item - 1, on a context that runs it inline. */
static void context_call(void *item) {
    if (pc_context_calls_too_deep()) {
        pc_context_run_later(item, context_call);
        return;
    }
    pc_context_call_begin();
    context_handler((unsigned)((uintptr_t)item - 1)); /* the context's execute: inline */
    pc_context_call_end();
}

static void test_context_calls_nest_then_queue(verdict *v) {
    memset(&context_chain, 0, sizeof context_chain);
    context_call((void *)(uintptr_t)1);
    CHECK(v, context_chain.count == 64, "every step ran once (%u ran)", context_chain.count);
    for (unsigned i = 0; i < 64; i++) {
        CHECK(v, context_chain.ran[i] == i, "step %u ran as %u: out of order", i, context_chain.ran[i]);
        CHECK(v, context_chain.depth_of[i] >= 1 && context_chain.depth_of[i] <= PC_CONTEXT_NESTING,
              "step %u ran inside %u calls, not inside its own and at most %u", i,
              context_chain.depth_of[i], PC_CONTEXT_NESTING);
    }
    CHECK(v, context_chain.depth_of[PC_CONTEXT_NESTING - 1] == PC_CONTEXT_NESTING,
          "calls nest up to the limit before they queue");
    CHECK(v, pc_context_call_depth == 0 && !pc_context_calls_too_deep(), "the calls all ended");
}

/* In order: enters and leaves, the request, and nothing retired twice or while inside. */
static void test_gate_in_order(verdict *v) {
    uintptr_t gate = 0;
    CHECK(v, pc_gate_enter(&gate), "a fresh gate lets a callback in");
    CHECK(v, pc_gate_enter(&gate), "and a second one");
    CHECK(v, !pc_gate_leave(&gate, true), "no retirement while another callback is inside");
    CHECK(v, pc_gate_leave(&gate, false), "the last one out retires what was asked for");
    CHECK(v, !pc_gate_enter(&gate), "a retired gate lets nobody in");
    CHECK(v, !pc_gate_leave(&gate, true), "and retires once only");
    uintptr_t quiet = 0;
    CHECK(v, pc_gate_enter(&quiet) && !pc_gate_leave(&quiet, false), "no request, no retirement");
}

/*
 * Racing callbacks, one of which asks for retirement: exactly one leaver retires, with
 * nobody inside, and no callback gets in after.
 */
enum { GATE_THREADS = 4 };

typedef struct {
    uintptr_t gate;
    atomic_uint inside;
    atomic_uint retirements;
    atomic_uint inside_at_retirement;
    atomic_uint entered_after;
    atomic_bool retired;
    unsigned long retired_by[GATE_THREADS];
} gate_context;

static void gate_prepare(void *context, unsigned long round) {
    gate_context *g = context;
    (void)round;
    g->gate = 0;
    atomic_store(&g->inside, 0);
    atomic_store(&g->retirements, 0);
    atomic_store(&g->inside_at_retirement, 0);
    atomic_store(&g->entered_after, 0);
    atomic_store(&g->retired, false);
}

static void gate_play(void *context, unsigned me, unsigned long round) {
    gate_context *g = context;
    spin_for((unsigned)((round * 31 + me * 97) % 400));
    if (pc_gate_enter(&g->gate)) {
        atomic_fetch_add(&g->inside, 1);
        atomic_fetch_add(&g->entered_after, atomic_load(&g->retired) ? 1u : 0u);
        spin_for(50);
        atomic_fetch_sub(&g->inside, 1);
    }
    if (pc_gate_leave(&g->gate, me == round % GATE_THREADS)) {
        atomic_fetch_add(&g->inside_at_retirement, atomic_load(&g->inside));
        atomic_fetch_add(&g->retirements, 1);
        atomic_store(&g->retired, true);
        g->retired_by[me] += 1;
    }
}

static void gate_check(void *context, unsigned long round, verdict *v) {
    gate_context *g = context;
    (void)round;
    CHECK(v, atomic_load(&g->retirements) == 1, "%u retirements", atomic_load(&g->retirements));
    CHECK(v, atomic_load(&g->inside_at_retirement) == 0, "retired with a callback inside");
    CHECK(v, atomic_load(&g->entered_after) == 0, "a callback got in after the retirement");
}

static void gate_summary(void *context, unsigned long rounds) {
    gate_context *g = context;
    (void)rounds;
    printf("# retired by each thread:");
    for (unsigned i = 0; i < GATE_THREADS; i++) {
        printf(" %lu", g->retired_by[i]);
    }
    printf("\n");
}

/* ---- pc_word_take, pc_word_take_marked: one value, one taker ---------------------- */

/* Odd threads take only a marked value (pc_word_take_marked, TAKE_MARK); odd rounds
 * store a marked one. */
enum { TAKE_THREADS = 4, TAKE_MARK = 2 };

typedef struct {
    uintptr_t word;
    atomic_uint takers;
    atomic_uintptr_t taken;
    atomic_uint unmarked_taken_by_marked_taker;
    unsigned long taken_by[TAKE_THREADS];
} take_context;

static uintptr_t take_value(unsigned long round) {
    return (uintptr_t)(round * 8 + 8) | (round % 2 != 0 ? TAKE_MARK : 0);  /* never 0 */
}

static void take_prepare(void *context, unsigned long round) {
    take_context *t = context;
    t->word = take_value(round);
    atomic_store(&t->takers, 0);
    atomic_store(&t->taken, 0);
    atomic_store(&t->unmarked_taken_by_marked_taker, 0);
}

static void take_play(void *context, unsigned me, unsigned long round) {
    take_context *t = context;
    spin_for((unsigned)((round * 17 + me * 53) % 200));
    bool marked_only = me % 2 != 0;
    uintptr_t value = marked_only ? pc_word_take_marked(&t->word, TAKE_MARK) : pc_word_take(&t->word);
    if (value != 0) {
        atomic_fetch_add(&t->takers, 1);
        atomic_store(&t->taken, value);
        if (marked_only && (value & TAKE_MARK) == 0) {
            atomic_fetch_add(&t->unmarked_taken_by_marked_taker, 1);
        }
        t->taken_by[me] += 1;
    }
}

static void take_check(void *context, unsigned long round, verdict *v) {
    take_context *t = context;
    CHECK(v, atomic_load(&t->takers) == 1, "%u takers", atomic_load(&t->takers));
    CHECK(v, atomic_load(&t->taken) == take_value(round), "took another value");
    CHECK(v, atomic_load(&t->unmarked_taken_by_marked_taker) == 0, "a marked-only taker took an unmarked value");
    CHECK(v, t->word == 0, "the word is not 0 after the take");
}

static void take_summary(void *context, unsigned long rounds) {
    take_context *t = context;
    (void)rounds;
    printf("# taken by each thread:");
    for (unsigned i = 0; i < TAKE_THREADS; i++) {
        printf(" %lu", t->taken_by[i]);
    }
    printf("\n");
}

/* ---- main ------------------------------------------------------------------------- */

int main(void) {
    read_environment();
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("# PROMISE_STRESS_ITERATIONS=%lu (0: defaults), PROMISE_STRESS_SECONDS=%g (0: no cap)\n",
           env_rounds, env_seconds);

    run_test("settle fires observers once, in registration order", test_settle_fires_in_order);
    run_test("observe after settle fires inline", test_observe_after_settle_fires_inline);
    run_test("claim FOLLOWING, then an outcome", test_following);
    run_test("observe while firing joins the next batch", test_observe_while_firing_joins_next_batch);
    run_test("detach returns unfired observers", test_detach);
    run_test("prune drops observers that gave up, keeps the order", test_prune_in_order);

    run_test("defer outside a fire runs at once", test_defer_outside_fire_runs_at_once);
    run_test("defer inside a fire runs after it returns", test_defer_inside_fire_runs_after_it);
    run_test("keep until cascade end: after deferred work, newest first", test_keep_until_cascade_end);
    run_test("keep until cascade end: in a destructor at thread exit", test_keep_in_a_destructor_at_thread_exit);
    run_test("inline observation: only outside scopes, on a quiescent outcome", test_inline_begin_end);
    run_test("chain of 100000 settles on a 256 KiB stack", test_chain_on_small_stack);
    run_test("forwarding epoch: begin/end, racing forwards", test_forwarding_epoch);
    run_test("forwarding epoch: stops at its largest value, never quiet there", test_forwarding_epoch_saturates);
    run_test("retirement gate: enters, leaves, one retirement", test_gate_in_order);
    run_test("cascade watch: only the watched promise counts, watches nest", test_cascade_watch);
    run_test("scope opener: only the outermost call's promise, while open", test_scope_opener);
    run_test("context calls: nest up to the limit, then queue in order", test_context_calls_nest_then_queue);

    static settlers_context settlers; /* static: zeroed, and too big for a crew's stack */
    const stress_test racing_settlers = {
        "racing settlers", SETTLERS, 20000,
        settlers_prepare, settlers_play, settlers_check, settlers_summary,
    };
    run_stress(&racing_settlers, &settlers);

    static race_context racing;
    race = &racing;
    const stress_test registration_race = {
        "registration racing the settle", 1 + REGISTRARS, 50000,
        race_prepare, race_play, race_check, race_summary,
    };
    run_stress(&registration_race, &racing);

    static prune_context prunes;
    const stress_test prune_race = {
        "prunes racing registrations, give-ups and the settle", 2 + PRUNE_REGISTRARS, 20000,
        prune_prepare, prune_play, prune_check, prune_summary,
    };
    run_stress(&prune_race, &prunes);

    static word_context words;
    const stress_test locked_word = {
        "locked word: readers never touch a finished target", 1 + WORD_READERS, 20000,
        word_prepare, word_play, word_check, word_summary,
    };
    run_stress(&locked_word, &words);

    static gate_context gates;
    const stress_test retirement_gate = {
        "retirement gate: one retirement, nobody inside", GATE_THREADS, 20000,
        gate_prepare, gate_play, gate_check, gate_summary,
    };
    run_stress(&retirement_gate, &gates);

    static take_context takes;
    const stress_test word_take = {
        "word take, marked or not: one value, one taker", TAKE_THREADS, 20000,
        take_prepare, take_play, take_check, take_summary,
    };
    run_stress(&word_take, &takes);

    printf("%u passed, %u failed\n", tests_passed, tests_failed);
    return tests_failed == 0 ? 0 : 1;
}
