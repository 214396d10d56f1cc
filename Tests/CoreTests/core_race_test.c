/*
 * core_race_test: races of the core's calls on several threads, the way the overlay makes
 * them, with exact invariants checked after every round.
 *
 *   make test-core (plain), make tsan-core and make asan-core (sanitizers), make
 *   test-core-32 (i386) and make stress-core (CORE_RACE_ROUNDS times the rounds) build
 *   and run it:
 *
 *   core_race_test [rounds-multiplier]      (default 1; each test has bounded rounds)
 *
 * Races the public operations the way the overlay can, and asserts exact invariants:
 *
 *   A  observe x3 + prune + publish on one promise; nodes give up at random, and nodes a
 *      prune released are re-registered (same address: ABA on the word). Every
 *      registration ends fired exactly once or released exactly once, never both; a node
 *      that did not give up is never released; nothing fires on the pruner's thread;
 *      per registrar, fires follow registration order; the payload written before the
 *      publish is seen by every fire; the final word is the bare outcome.
 *   B  a deterministic interleaving (gave_up used as a hook): the pruner holds the stack
 *      while a registrar pushes and the publisher starts; order kept, publisher waits.
 *   C  the cancellation registry: pushers vs a canceller (CLAIMED, PUBLISHED, take, push
 *      back) vs a pruner (take, push back, re-apply a published cancel): every link is
 *      reached, the stack is intact (every link once, no cycle), the count balances.
 *   D  the trampoline from several threads: chains of promises settled from deferred
 *      work across threads, keep_until_cascade_end past 32 and 1024 entries, inline
 *      begin/end: every deferred node runs once, FIFO, every kept item released once,
 *      newest first, before the outermost call returns.
 *   E  the retirement gate, count_down / once, word lock / take / take_marked, holds
 *      Dekker with publish, forwarding begin/end.
 *   F  a prune's put-back of the nodes it kept racing a flood of pushes.
 *   G  holds against a retirement's registry count, and context calls nesting past their
 *      limit.
 */
#define _POSIX_C_SOURCE 200809L

#include "CPromiseCore.h"
#include "spin_barrier.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- plumbing ---------------------------------------------------------------------- */

static unsigned long multiplier = 1;
static int failures;

#define FAIL(...)                                                        \
    do {                                                                 \
        fprintf(stderr, "FAIL %s:%d: ", __func__, __LINE__);             \
        fprintf(stderr, __VA_ARGS__);                                    \
        fprintf(stderr, "\n");                                           \
        fflush(stderr);                                                  \
        abort();                                                         \
    } while (0)

#define REQUIRE(cond, ...)          \
    do {                            \
        if (!(cond)) {              \
            FAIL(__VA_ARGS__);      \
        }                           \
    } while (0)

static _Thread_local unsigned tid; /* 1-based per test; 0 main */
static _Thread_local uint64_t rng_state;

static uint64_t rnd(void) {
    uint64_t x = rng_state ? rng_state : 0x9E3779B97F4A7C15ull + tid;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    rng_state = x;
    return x;
}

typedef struct {
    spin_barrier start, done;
    atomic_bool stop;
    unsigned nthreads;
    void (*play)(unsigned me, unsigned long round);
    atomic_ulong round;
} crew;

static crew the_crew;

static void *crew_main(void *arg) {
    tid = (unsigned)(uintptr_t)arg;
    rng_state = 0x1234567ull * (tid + 1);
    for (;;) {
        spin_barrier_wait(&the_crew.start);
        if (atomic_load(&the_crew.stop)) {
            return NULL;
        }
        the_crew.play(tid, atomic_load(&the_crew.round));
        spin_barrier_wait(&the_crew.done);
    }
}

/* Runs `rounds` rounds of `play` on n threads (tids 1..n); prepare/check on main. */
static void run_crew(const char *name, unsigned n, unsigned long rounds,
                     void (*prepare)(unsigned long), void (*play)(unsigned, unsigned long),
                     void (*check)(unsigned long)) {
    pthread_t threads[16];
    the_crew.nthreads = n;
    the_crew.play = play;
    atomic_store(&the_crew.stop, false);
    spin_barrier_init(&the_crew.start, n + 1);
    spin_barrier_init(&the_crew.done, n + 1);
    for (unsigned i = 0; i < n; i++) {
        if (pthread_create(&threads[i], NULL, crew_main, (void *)(uintptr_t)(i + 1)) != 0) {
            FAIL("pthread_create");
        }
    }
    for (unsigned long r = 0; r < rounds; r++) {
        prepare(r);
        atomic_store(&the_crew.round, r);
        spin_barrier_wait(&the_crew.start);
        spin_barrier_wait(&the_crew.done);
        check(r);
    }
    atomic_store(&the_crew.stop, true);
    spin_barrier_wait(&the_crew.start);
    for (unsigned i = 0; i < n; i++) {
        pthread_join(threads[i], NULL);
    }
    printf("ok - %s (%lu rounds)\n", name, rounds);
    fflush(stdout);
}

/* ---- A: observe x3 + prune + publish, give-ups, re-registration (ABA) -------------- */

enum { A_REGISTRARS = 3, A_NODES = 24, A_PRUNER = 4, A_PUBLISHER = 5 };
enum { ST_PUSHED = 0, ST_FIRED = 1, ST_RELEASED = 2, ST_IDLE = 3 };

typedef struct {
    pc_node node;           /* first */
    atomic_int st;          /* ST_* for the current registration */
    atomic_bool gave_up;
    unsigned registrar;
    unsigned long reg_seq;  /* registrar-local registration number, current registration */
    unsigned long fired_seq_clock; /* global fire clock at fire */
    unsigned fired_on;
    atomic_ulong fires, releases; /* totals over all registrations of this node */
} a_obs;

typedef struct {
    pc_promise core;
    uint64_t payload;
} a_promise;

static _Alignas(64) a_promise a_p;
static a_obs a_nodes[A_REGISTRARS][A_NODES];
static atomic_ulong a_clock;
static atomic_ulong a_registrations, a_fires, a_releases;
static atomic_ulong a_prunes_ok, a_prune_dropped, a_repushes, a_inline_fires;
/* per registrar: the last registration number fired, to check order */
static unsigned long a_last_fired_seq[A_REGISTRARS];
static unsigned long a_reg_counter[A_REGISTRARS];
static atomic_bool a_published;
static unsigned long a_registrations_at_start;

static void a_fire(pc_node *node, pc_promise *source) {
    a_obs *o = (a_obs *)(void *)node;
    REQUIRE(source == &a_p.core, "fire with source %p", (void *)source);
    REQUIRE(tid != A_PRUNER, "node fired on the pruner's thread");
    REQUIRE(pc_state(source) != PC_PENDING, "fired while pending");
    /* plain read: published by the release of pc_publish's CAS */
    REQUIRE(a_p.payload == 0xC0FFEE00u + (uint64_t)pc_state(source), "payload %llx not visible",
            (unsigned long long)a_p.payload);
    int expected = ST_PUSHED;
    REQUIRE(atomic_compare_exchange_strong(&o->st, &expected, ST_FIRED),
            "node r%u seq %lu fired in state %d (twice, or after release)", o->registrar,
            o->reg_seq, expected);
    o->fired_on = tid;
    o->fired_seq_clock = atomic_fetch_add(&a_clock, 1);
    /* per-registrar order: fires happen-before each other along the clock (publisher
     * thread in order; a registrar's inline fire after the publisher went quiescent) */
    unsigned r = o->registrar;
    REQUIRE(o->reg_seq > a_last_fired_seq[r] || a_last_fired_seq[r] == 0,
            "registrar %u: registration %lu fired after %lu", r, o->reg_seq, a_last_fired_seq[r]);
    a_last_fired_seq[r] = o->reg_seq;
    atomic_fetch_add(&o->fires, 1);
    atomic_fetch_add(&a_fires, 1);
    if (tid != A_PUBLISHER) {
        atomic_fetch_add(&a_inline_fires, 1);
        REQUIRE(tid == o->registrar + 1, "inline fire on thread %u, registrar %u", tid,
                o->registrar + 1);
    }
}

static bool a_gave_up(pc_node *node, void *context) {
    REQUIRE(context == &a_p, "context");
    a_obs *o = (a_obs *)(void *)node;
    REQUIRE(atomic_load(&o->st) == ST_PUSHED, "pruner saw a node in state %d",
            atomic_load(&o->st));
    return atomic_load(&o->gave_up);
}

static void a_release(pc_node *node, void *context) {
    (void)context;
    a_obs *o = (a_obs *)(void *)node;
    REQUIRE(atomic_load(&o->gave_up), "released a node that did not give up");
    int expected = ST_PUSHED;
    REQUIRE(atomic_compare_exchange_strong(&o->st, &expected, ST_RELEASED),
            "node released in state %d", expected);
    atomic_fetch_add(&o->releases, 1);
    atomic_fetch_add(&a_releases, 1);
    atomic_fetch_add(&a_prune_dropped, 1);
}

static void a_register(a_obs *o) {
    unsigned r = o->registrar;
    o->reg_seq = ++a_reg_counter[r];
    atomic_store(&o->gave_up, false);
    atomic_store(&o->st, ST_PUSHED);
    o->node.fire = a_fire;
    atomic_fetch_add(&a_registrations, 1);
    pc_observe(&a_p.core, &o->node);
}

static void a_prepare(unsigned long round) {
    (void)round;
    memset(&a_p, 0, sizeof a_p);
    memset(a_last_fired_seq, 0, sizeof a_last_fired_seq);
    memset(a_reg_counter, 0, sizeof a_reg_counter);
    atomic_store(&a_published, false);
    a_registrations_at_start = atomic_load(&a_registrations);
    for (unsigned r = 0; r < A_REGISTRARS; r++) {
        for (unsigned i = 0; i < A_NODES; i++) {
            a_obs *o = &a_nodes[r][i];
            memset(o, 0, sizeof *o);
            o->registrar = r;
            atomic_store(&o->st, ST_IDLE);
        }
    }
}

static void a_play(unsigned me, unsigned long round) {
    if (me <= A_REGISTRARS) {
        unsigned r = me - 1;
        for (unsigned i = 0; i < A_NODES; i++) {
            a_obs *o = &a_nodes[r][i];
            a_register(o);
            /* give up right after the push, sometimes */
            if (rnd() % 3 == 0) {
                atomic_store(&o->gave_up, true);
            }
            if ((rnd() & 7) == 0) {
                spin_for((unsigned)(rnd() % 200));
            }
            /* re-register nodes a prune released: same address again */
            unsigned j = (unsigned)(rnd() % (i + 1));
            a_obs *q = &a_nodes[r][j];
            if (atomic_load(&q->st) == ST_RELEASED) {
                atomic_fetch_add(&a_repushes, 1);
                a_register(q);
            }
        }
        /* until the settle, keep re-registering released nodes (bounded) */
        for (unsigned k = 0; k < 4 * A_NODES && !atomic_load(&a_published); k++) {
            a_obs *q = &a_nodes[r][k % A_NODES];
            if (atomic_load(&q->st) == ST_RELEASED) {
                atomic_fetch_add(&a_repushes, 1);
                a_register(q);
                if (rnd() % 2 == 0) {
                    atomic_store(&q->gave_up, true);
                }
            }
            sched_yield();
        }
        return;
    }
    if (me == A_PRUNER) {
        size_t kept;
        while (!atomic_load(&a_published)) {
            if (pc_prune(&a_p.core, a_gave_up, a_release, &a_p, &kept)) {
                atomic_fetch_add(&a_prunes_ok, 1);
            }
            spin_for((unsigned)(rnd() % 50));
        }
        /* a prune of a settled promise does nothing */
        REQUIRE(!pc_prune(&a_p.core, a_gave_up, a_release, &a_p, &kept),
                "prune of a settled promise returned true");
        return;
    }
    if (me == A_PUBLISHER) {
        /* publish after a round-dependent share of the registrations, so that prunes
         * see stacks with give-ups and re-registrations happen before the settle */
        unsigned long target = (round * 37) % (A_REGISTRARS * A_NODES);
        while (atomic_load(&a_registrations) - a_registrations_at_start < target) {
            sched_yield();
        }
        spin_for((unsigned)(rnd() % 2000));
        uintptr_t outcome = PC_FULFILLED + (uintptr_t)(round % 3);
        REQUIRE(pc_claim(&a_p.core, PC_CLAIM_FREE, outcome), "claim lost");
        a_p.payload = 0xC0FFEE00u + outcome;
        pc_publish(&a_p.core);
        atomic_store(&a_published, true);
    }
}

static void a_check(unsigned long round) {
    uintptr_t outcome = PC_FULFILLED + (uintptr_t)(round % 3);
    uintptr_t word = atomic_load((_Atomic uintptr_t *)(void *)&a_p.core.state);
    REQUIRE(word == outcome, "final word %#lx, want bare outcome %lu", (unsigned long)word,
            (unsigned long)outcome);
    for (unsigned r = 0; r < A_REGISTRARS; r++) {
        for (unsigned i = 0; i < A_NODES; i++) {
            a_obs *o = &a_nodes[r][i];
            int st = atomic_load(&o->st);
            REQUIRE(st == ST_FIRED || st == ST_RELEASED,
                    "round %lu: node r%u/%u ended in state %d (lost)", round, r, i, st);
            if (!atomic_load(&o->gave_up)) {
                REQUIRE(st == ST_FIRED, "a node that did not give up was not fired");
            }
        }
    }
    REQUIRE(atomic_load(&a_registrations) == atomic_load(&a_fires) + atomic_load(&a_releases),
            "registrations %lu != fires %lu + releases %lu", atomic_load(&a_registrations),
            atomic_load(&a_fires), atomic_load(&a_releases));
    REQUIRE(!pc_has_waiting_observers(&a_p.core), "waiting observers after quiescence");
    REQUIRE(pc_detach(&a_p.core) == NULL, "detach of a settled promise");
}

/* ---- B: deterministic: pruner holds the stack, registrar pushes, publisher waits ---- */

typedef struct {
    pc_node node;
    int id;
    bool gives_up;
    atomic_int fired;
    atomic_int released;
} b_obs;

static pc_promise b_p;
static b_obs b_nodes[6];
static atomic_int b_phase;
static int b_order[8];
static atomic_int b_norder;
static atomic_bool b_publisher_returned;

static void b_fire(pc_node *node, pc_promise *source) {
    (void)source;
    b_obs *o = (b_obs *)(void *)node;
    REQUIRE(atomic_fetch_add(&o->fired, 1) == 0, "node %d fired twice", o->id);
    REQUIRE(atomic_load(&o->released) == 0, "node %d fired after release", o->id);
    b_order[atomic_fetch_add(&b_norder, 1)] = o->id;
}

static bool b_gave_up(pc_node *node, void *context) {
    (void)context;
    b_obs *o = (b_obs *)(void *)node;
    if (atomic_load(&b_phase) == 0) {
        /* hook: we hold the stack; let the registrar push and the publisher start */
        atomic_store(&b_phase, 1);
        while (atomic_load(&b_phase) != 3) {
            sched_yield();
        }
        /* The publisher is about to call pc_publish, or in it: while we hold the stack
         * it must not return, however long we give it (it waits for the prune). */
        for (int i = 0; i < 2000; i++) {
            REQUIRE(!atomic_load(&b_publisher_returned), "publisher did not wait for the prune");
            sched_yield();
        }
    }
    return o->gives_up;
}

static void b_release(pc_node *node, void *context) {
    (void)context;
    b_obs *o = (b_obs *)(void *)node;
    REQUIRE(atomic_fetch_add(&o->released, 1) == 0, "released twice");
}

static void *b_registrar(void *arg) {
    (void)arg;
    tid = 2;
    while (atomic_load(&b_phase) != 1) {
        sched_yield();
    }
    pc_observe(&b_p, &b_nodes[3].node); /* pushed during the prune */
    pc_observe(&b_p, &b_nodes[4].node);
    atomic_store(&b_phase, 2);
    return NULL;
}

static void *b_publisher(void *arg) {
    (void)arg;
    tid = 3;
    while (atomic_load(&b_phase) != 2) {
        sched_yield();
    }
    REQUIRE(pc_claim(&b_p, PC_CLAIM_FREE, PC_REJECTED), "claim");
    atomic_store(&b_phase, 3);
    pc_publish(&b_p);
    atomic_store(&b_publisher_returned, true);
    return NULL;
}

static void test_b(void) {
    for (int round = 0; round < 20; round++) {
        memset(&b_p, 0, sizeof b_p);
        memset(b_nodes, 0, sizeof b_nodes);
        atomic_store(&b_phase, 0);
        atomic_store(&b_norder, 0);
        atomic_store(&b_publisher_returned, false);
        for (int i = 0; i < 6; i++) {
            b_nodes[i].id = i;
            b_nodes[i].node.fire = b_fire;
        }
        b_nodes[1].gives_up = true;
        pc_observe(&b_p, &b_nodes[0].node);
        pc_observe(&b_p, &b_nodes[1].node);
        pc_observe(&b_p, &b_nodes[2].node);
        pthread_t t1, t2;
        pthread_create(&t1, NULL, b_registrar, NULL);
        pthread_create(&t2, NULL, b_publisher, NULL);
        size_t kept = 99;
        REQUIRE(pc_prune(&b_p, b_gave_up, b_release, NULL, &kept), "prune");
        REQUIRE(kept == 2, "kept %zu", kept);
        pthread_join(t1, NULL);
        pthread_join(t2, NULL);
        REQUIRE(atomic_load(&b_nodes[1].released) == 1, "node 1 not released");
        REQUIRE(atomic_load(&b_norder) == 4, "fired %d nodes", atomic_load(&b_norder));
        int want[4] = {0, 2, 3, 4};
        for (int i = 0; i < 4; i++) {
            REQUIRE(b_order[i] == want[i], "fire %d was node %d, want %d", i, b_order[i], want[i]);
        }
        /* a late observer on the quiescent promise fires inline */
        pc_observe(&b_p, &b_nodes[5].node);
        REQUIRE(atomic_load(&b_nodes[5].fired) == 1, "late observer did not fire inline");
    }
    printf("ok - B deterministic prune/push/publish interleaving (20 rounds)\n");
}

/* ---- C: the registry: pushers vs canceller vs pruner ------------------------------- */

enum { C_PUSHERS = 3, C_LINKS = 40, C_CANCELLER = 4, C_PRUNER = 5 };

typedef struct {
    pc_link link; /* first */
    unsigned id;
    atomic_int reached;   /* canceller took it after PUBLISHED, or a pruner re-applied */
    atomic_int self_saw;  /* its pusher saw PUBLISHED after its push */
    atomic_int pushed;
} c_child;

static pc_promise c_p;
static c_child c_children[C_PUSHERS * C_LINKS];
static atomic_bool c_cancel_done;
static atomic_ulong c_reach_by_canceller, c_reach_by_pruner, c_reach_by_self;

static unsigned c_take_and_push_back(c_child **taken, unsigned cap) {
    pc_link *l = pc_children_take(&c_p);
    unsigned n = 0;
    for (; l != NULL; l = l->next) {
        REQUIRE(n < cap, "taken more links than exist (cycle?)");
        taken[n++] = (c_child *)(void *)l;
    }
    /* push back oldest first, so order is kept */
    for (unsigned i = n; i-- > 0;) {
        pc_children_push(&c_p, &taken[i]->link);
    }
    if (n != 0) {
        pc_children_forget(&c_p, n);
    }
    return n;
}

static void c_prepare(unsigned long round) {
    (void)round;
    memset(&c_p, 0, sizeof c_p);
    memset(c_children, 0, sizeof c_children);
    for (unsigned i = 0; i < C_PUSHERS * C_LINKS; i++) {
        c_children[i].id = i;
    }
    atomic_store(&c_cancel_done, false);
}

static void c_play(unsigned me, unsigned long round) {
    c_child *taken[C_PUSHERS * C_LINKS];
    if (me <= C_PUSHERS) {
        for (unsigned i = 0; i < C_LINKS; i++) {
            c_child *c = &c_children[(me - 1) * C_LINKS + i];
            atomic_store(&c->pushed, 1);
            pc_children_push(&c_p, &c->link);
            if (pc_tree_flags(&c_p) & PC_TREE_CANCEL_PUBLISHED) {
                atomic_store(&c->self_saw, 1);
            }
            if ((rnd() & 3) == 0) {
                spin_for((unsigned)(rnd() % 300));
            }
        }
        return;
    }
    if (me == C_CANCELLER) {
        spin_for((unsigned)((round * 4099) % 6000));
        REQUIRE(pc_tree_flags_set(&c_p, PC_TREE_CANCEL_CLAIMED), "claimed twice");
        REQUIRE(pc_tree_flags_set(&c_p, PC_TREE_CANCEL_PUBLISHED), "published twice");
        unsigned n = c_take_and_push_back(taken, C_PUSHERS * C_LINKS);
        for (unsigned i = 0; i < n; i++) {
            atomic_store(&taken[i]->reached, 1);
        }
        atomic_fetch_add(&c_reach_by_canceller, n);
        atomic_store(&c_cancel_done, true);
        return;
    }
    if (me == C_PRUNER) {
        for (unsigned k = 0; k < 200; k++) {
            unsigned n = c_take_and_push_back(taken, C_PUSHERS * C_LINKS);
            /* re-apply a published cancel to the links it held */
            if (pc_tree_flags(&c_p) & PC_TREE_CANCEL_PUBLISHED) {
                for (unsigned i = 0; i < n; i++) {
                    atomic_store(&taken[i]->reached, 1);
                }
                atomic_fetch_add(&c_reach_by_pruner, n);
            }
            spin_for((unsigned)(rnd() % 100));
        }
    }
}

static void c_check(unsigned long round) {
    (void)round;
    unsigned total = C_PUSHERS * C_LINKS;
    for (unsigned i = 0; i < total; i++) {
        c_child *c = &c_children[i];
        REQUIRE(atomic_load(&c->reached) || atomic_load(&c->self_saw),
                "round %lu: link %u missed by the cancel (not taken, pusher saw no PUBLISHED)",
                round, i);
        if (atomic_load(&c->self_saw)) {
            atomic_fetch_add(&c_reach_by_self, 1);
        }
    }
    /* the stack holds every link exactly once */
    static unsigned char seen[C_PUSHERS * C_LINKS];
    memset(seen, 0, sizeof seen);
    unsigned n = 0;
    for (pc_link *l = pc_children_take(&c_p); l != NULL; l = l->next) {
        c_child *c = (c_child *)(void *)l;
        REQUIRE(c >= c_children && c < c_children + total, "foreign link");
        REQUIRE(!seen[c->id], "link %u twice in the stack", c->id);
        seen[c->id] = 1;
        n++;
    }
    REQUIRE(n == total, "stack holds %u of %u links", n, total);
    uintptr_t count = pc_tree_flags(&c_p) >> PC_TREE_COUNT_SHIFT;
    REQUIRE(count == total, "link count %lu, want %u", (unsigned long)count, total);
}

/* ---- D: the trampoline from several threads ---------------------------------------- */

enum { D_THREADS = 4, D_CHAIN = 300, D_KEEP = 1500 };

typedef struct d_link {
    pc_node node; /* first */
    struct d_promise *next_promise; /* what its deferred run settles */
    unsigned index;
    unsigned owner;
    atomic_int fired_with_source;
    atomic_int fired_deferred;
} d_link;

typedef struct d_promise {
    pc_promise core;
    uint64_t payload;
} d_promise;

static d_promise d_promises[D_THREADS][D_CHAIN + 1];
static d_link d_links[D_THREADS][D_CHAIN];
static _Thread_local unsigned d_depth_max, d_depth;
static _Thread_local unsigned d_kept_next_expected;
static _Thread_local unsigned d_kept_released;
static unsigned d_kept_items[D_THREADS][D_KEEP];

static void d_release(void *item) {
    unsigned *p = item;
    /* newest first: items released in strictly decreasing order */
    REQUIRE(*p == d_kept_next_expected, "kept item %u released, expected %u", *p,
            d_kept_next_expected);
    d_kept_next_expected -= 1;
    d_kept_released += 1;
}

static void d_fire(pc_node *node, pc_promise *source) {
    d_link *l = (d_link *)(void *)node;
    d_depth++;
    if (d_depth > d_depth_max) {
        d_depth_max = d_depth;
    }
    if (source != NULL) {
        REQUIRE(atomic_fetch_add(&l->fired_with_source, 1) == 0, "fired twice");
        d_promise *p = (d_promise *)(void *)source;
        REQUIRE(p->payload == 1000u + l->index, "payload not visible");
        pc_defer(node); /* run the step on this thread's trampoline */
    } else {
        REQUIRE(atomic_fetch_add(&l->fired_deferred, 1) == 0, "deferred run twice");
        REQUIRE(atomic_load(&l->fired_with_source) == 1, "deferred before fired");
        d_promise *n = l->next_promise;
        REQUIRE(pc_claim(&n->core, PC_CLAIM_FREE, PC_FULFILLED), "claim of next");
        n->payload = 1000u + l->index + 1;
        pc_publish(&n->core); /* nested publish: must fire inline-deferred, no recursion */
    }
    d_depth--;
}

static void d_prepare(unsigned long round) {
    (void)round;
    memset(d_promises, 0, sizeof d_promises);
    memset(d_links, 0, sizeof d_links);
    /* chain t: promise[t][i] --link[t][i]--> promise[t][i+1]; link i registered by the
     * thread (t + 1) % D_THREADS, so a chain's nodes belong to another thread */
    for (unsigned t = 0; t < D_THREADS; t++) {
        for (unsigned i = 0; i < D_CHAIN; i++) {
            d_link *l = &d_links[t][i];
            l->node.fire = d_fire;
            l->index = i;
            l->owner = (t + 1) % D_THREADS;
            l->next_promise = &d_promises[t][i + 1];
        }
    }
}

static void d_play(unsigned me, unsigned long round) {
    unsigned t = me - 1;
    /* register the other thread's chain, half of it before, half racing */
    unsigned other = (t + D_THREADS - 1) % D_THREADS; /* the chain whose links we own */
    for (unsigned i = 0; i < D_CHAIN; i++) {
        pc_observe(&d_promises[other][i].core, &d_links[other][i].node);
    }
    /* settle our own chain's head: a chain of D_CHAIN deferred steps, run on whichever
     * thread settled each promise (ours, or a registrar's for links fired inline) */
    d_depth_max = 0;
    REQUIRE(pc_claim(&d_promises[t][0].core, PC_CLAIM_FREE, PC_FULFILLED), "claim head");
    d_promises[t][0].payload = 1000u;
    pc_publish(&d_promises[t][0].core);
    REQUIRE(d_depth_max <= 2, "fire depth %u: the trampoline nested", d_depth_max);

    /* keep_until_cascade_end inside a scope, past the inline 32 and the retained 1024 */
    unsigned want = (round & 1) ? D_KEEP : 40;
    d_kept_released = 0;
    d_kept_next_expected = want - 1;
    REQUIRE(!pc_keep_until_cascade_end(&d_kept_items[t][0], d_release), "kept outside scope");
    if (pc_inline_begin(&d_promises[t][0].core) == PC_FULFILLED) {
        for (unsigned i = 0; i < want; i++) {
            d_kept_items[t][i] = i;
            REQUIRE(pc_keep_until_cascade_end(&d_kept_items[t][i], d_release), "keep");
        }
        REQUIRE(pc_cascade_keeps_last(&d_kept_items[t][want - 1], d_release), "keeps last");
        pc_inline_end();
        REQUIRE(d_kept_released == want, "released %u of %u", d_kept_released, want);
    } else {
        FAIL("inline_begin on a quiescent settled promise returned pending");
    }
}

static void d_check(unsigned long round) {
    (void)round;
    for (unsigned t = 0; t < D_THREADS; t++) {
        for (unsigned i = 0; i <= D_CHAIN; i++) {
            REQUIRE(pc_state(&d_promises[t][i].core) == PC_FULFILLED, "chain %u step %u not settled",
                    t, i);
        }
        for (unsigned i = 0; i < D_CHAIN; i++) {
            REQUIRE(atomic_load(&d_links[t][i].fired_deferred) == 1, "link not run");
        }
    }
}

/* ---- E: gate, countdown, once, words, holds Dekker, forwarding --------------------- */

enum { E_THREADS = 4 };

static uintptr_t e_gate;
static atomic_int e_inside, e_retired, e_retires, e_requests;
static uintptr_t e_counter, e_once;
static atomic_int e_zero_hits, e_once_wins;
static uintptr_t e_word;
static uint64_t e_target_value; /* plain: guarded by the word lock */
static uintptr_t e_take_word;
static atomic_int e_takes;
static pc_promise e_hp;
static pc_lineage e_lin;
static atomic_int e_saw_pub, e_saw_self, e_cleared;

static void e_prepare(unsigned long round) {
    (void)round;
    e_gate = 0;
    atomic_store(&e_inside, 0);
    atomic_store(&e_retired, 0);
    atomic_store(&e_retires, 0);
    atomic_store(&e_requests, 0);
    e_counter = E_THREADS;
    e_once = 0;
    atomic_store(&e_zero_hits, 0);
    atomic_store(&e_once_wins, 0);
    e_word = 0x1000;
    e_target_value = 0;
    e_take_word = 0x2000 | 1u;
    atomic_store(&e_takes, 0);
    memset(&e_hp, 0, sizeof e_hp);
    memset(&e_lin, 0, sizeof e_lin);
    atomic_store(&e_saw_pub, 0);
    atomic_store(&e_saw_self, 0);
    atomic_store(&e_cleared, 0);
}

static void e_play(unsigned me, unsigned long round) {
    /* gate */
    for (int k = 0; k < 3; k++) {
        bool in = pc_gate_enter(&e_gate);
        if (in) {
            atomic_fetch_add(&e_inside, 1);
            REQUIRE(!atomic_load(&e_retired), "callback inside after retirement");
            spin_for((unsigned)(rnd() % 100));
            atomic_fetch_sub(&e_inside, 1);
        }
        bool request = (rnd() & 1) != 0 && k == 2;
        if (request) {
            atomic_fetch_add(&e_requests, 1);
        }
        if (pc_gate_leave(&e_gate, request)) {
            REQUIRE(atomic_load(&e_inside) == 0, "retired with a callback inside");
            atomic_store(&e_retired, 1);
            atomic_fetch_add(&e_retires, 1);
        }
    }
    /* countdown and once */
    if (pc_count_down(&e_counter) == 0) {
        atomic_fetch_add(&e_zero_hits, 1);
    }
    if (pc_once(&e_once)) {
        atomic_fetch_add(&e_once_wins, 1);
    }
    /* locked word: every holder increments the plain value */
    for (int k = 0; k < 50; k++) {
        uintptr_t v = pc_word_lock(&e_word);
        REQUIRE(v == 0x1000, "locked word value %#lx", (unsigned long)v);
        e_target_value += 1;
        pc_word_unlock(&e_word, v);
    }
    /* take_marked: exactly one taker */
    if (pc_word_take_marked(&e_take_word, 1u) != 0) {
        atomic_fetch_add(&e_takes, 1);
    }
    /* holds Dekker: thread 1 goes in flight, thread 2 publishes */
    if (me == 1) {
        spin_for((unsigned)(round % 500));
        pc_holds_add(&e_lin, PC_HOLDS_SELF);
        if (pc_state_after_hold(&e_hp) != PC_PENDING) {
            atomic_store(&e_saw_pub, 1);
            if (pc_holds_clear_self(&e_lin) & PC_HOLDS_SELF) {
                atomic_fetch_add(&e_cleared, 1);
            }
        }
    } else if (me == 2) {
        spin_for((unsigned)((round * 13) % 500));
        REQUIRE(pc_claim(&e_hp, PC_CLAIM_FREE, PC_FULFILLED), "claim");
        pc_publish(&e_hp);
        if (pc_holds_after_publish(&e_lin) & PC_HOLDS_SELF) {
            atomic_store(&e_saw_self, 1);
            if (pc_holds_clear_self(&e_lin) & PC_HOLDS_SELF) {
                atomic_fetch_add(&e_cleared, 1);
            }
        }
    }
    /* forwarding */
    pc_forwarding_begin();
    spin_for((unsigned)(rnd() % 50));
    pc_forwarding_end();
}

static void e_check(unsigned long round) {
    (void)round;
    REQUIRE(atomic_load(&e_retires) == (atomic_load(&e_requests) != 0 ? 1 : 0),
            "retired %d times, %d requests", atomic_load(&e_retires), atomic_load(&e_requests));
    REQUIRE(atomic_load(&e_zero_hits) == 1, "countdown reached zero %d times",
            atomic_load(&e_zero_hits));
    REQUIRE(atomic_load(&e_once_wins) == 1, "once won %d times", atomic_load(&e_once_wins));
    REQUIRE(e_target_value == 50u * E_THREADS, "lock lost updates: %llu",
            (unsigned long long)e_target_value);
    REQUIRE(atomic_load(&e_takes) == 1, "take_marked took %d times", atomic_load(&e_takes));
    REQUIRE(atomic_load(&e_saw_pub) || atomic_load(&e_saw_self),
            "holds Dekker: neither side saw the other");
    REQUIRE(atomic_load(&e_cleared) == 1, "SELF cleared %d times", atomic_load(&e_cleared));
    REQUIRE(pc_forwarding_is_quiet(pc_forwarding_epoch()), "forwarding not quiet");
}

/* ---- F: the put-back racing a flood of pushes (retry path of the put-back CAS) ------ */

enum { F_BEFORE = 3, F_FLOOD = 20000 };

typedef struct {
    pc_node node;
    unsigned long seq; /* registration order of its registrar */
    unsigned who;
    bool gives_up;
    atomic_int fired, released;
} f_obs;

static pc_promise f_p;
static f_obs *f_nodes; /* F_BEFORE + 2 * F_FLOOD */
static atomic_int f_phase;
static atomic_ulong f_pushed;
static unsigned long f_last_seq[3];
static atomic_ulong f_fired;

static void f_fire(pc_node *node, pc_promise *source) {
    (void)source;
    f_obs *o = (f_obs *)(void *)node;
    REQUIRE(atomic_fetch_add(&o->fired, 1) == 0, "fired twice");
    REQUIRE(atomic_load(&o->released) == 0, "fired after release");
    REQUIRE(o->seq > f_last_seq[o->who] || (f_last_seq[o->who] == 0 && o->seq == 0),
            "order: registrar %u seq %lu after %lu", o->who, o->seq, f_last_seq[o->who]);
    f_last_seq[o->who] = o->seq;
    atomic_fetch_add(&f_fired, 1);
}

static bool f_gave_up(pc_node *node, void *context) {
    (void)context;
    if (atomic_load(&f_phase) == 0) {
        atomic_store(&f_phase, 1); /* let the flood start while we hold the stack */
        while (atomic_load(&f_pushed) < F_FLOOD / 2) {
            sched_yield();
        }
    }
    return ((f_obs *)(void *)node)->gives_up;
}

static void f_release(pc_node *node, void *context) {
    (void)context;
    f_obs *o = (f_obs *)(void *)node;
    REQUIRE(o->gives_up, "released a keeper");
    REQUIRE(atomic_fetch_add(&o->released, 1) == 0, "released twice");
}

static void *f_flooder(void *arg) {
    unsigned who = (unsigned)(uintptr_t)arg;
    tid = 10 + who;
    while (atomic_load(&f_phase) == 0) {
        sched_yield();
    }
    f_obs *base = f_nodes + F_BEFORE + (size_t)(who - 1) * F_FLOOD;
    for (unsigned i = 0; i < F_FLOOD; i++) {
        pc_observe(&f_p, &base[i].node);
        atomic_fetch_add(&f_pushed, 1);
    }
    return NULL;
}

static void test_f(void) {
    size_t total = F_BEFORE + 2 * (size_t)F_FLOOD;
    f_nodes = calloc(total, sizeof *f_nodes);
    REQUIRE(f_nodes != NULL, "calloc");
    unsigned long rounds = 3 * multiplier;
    for (unsigned long round = 0; round < rounds; round++) {
        memset(&f_p, 0, sizeof f_p);
        memset(f_nodes, 0, total * sizeof *f_nodes);
        memset(f_last_seq, 0, sizeof f_last_seq);
        atomic_store(&f_phase, 0);
        atomic_store(&f_pushed, 0);
        atomic_store(&f_fired, 0);
        for (size_t i = 0; i < total; i++) {
            f_obs *o = &f_nodes[i];
            o->node.fire = f_fire;
            if (i < F_BEFORE) {
                o->who = 0;
                o->seq = i;
                o->gives_up = (i == 1);
            } else {
                o->who = (unsigned)(1 + (i - F_BEFORE) / F_FLOOD);
                o->seq = (i - F_BEFORE) % F_FLOOD + 1;
            }
        }
        for (unsigned i = 0; i < F_BEFORE; i++) {
            pc_observe(&f_p, &f_nodes[i].node);
        }
        pthread_t t1, t2;
        pthread_create(&t1, NULL, f_flooder, (void *)(uintptr_t)1);
        pthread_create(&t2, NULL, f_flooder, (void *)(uintptr_t)2);
        size_t kept;
        REQUIRE(pc_prune(&f_p, f_gave_up, f_release, NULL, &kept), "prune");
        REQUIRE(kept == F_BEFORE - 1, "kept %zu", kept);
        pthread_join(t1, NULL);
        pthread_join(t2, NULL);
        REQUIRE(pc_claim(&f_p, PC_CLAIM_FREE, PC_FULFILLED), "claim");
        pc_publish(&f_p);
        REQUIRE(atomic_load(&f_fired) == total - 1, "fired %lu of %zu",
                atomic_load(&f_fired), total - 1);
    }
    free(f_nodes);
    printf("ok - F put-back racing a flood of pushes (%lu rounds)\n", rounds);
}

/* ---- G: holds, retirement flags vs registry count, context/slot nesting, detach ----- */

enum { G_THREADS = 4, G_ITER = 400 };

static pc_lineage g_lin;
static atomic_long g_refs;
static pc_promise g_p;
static pc_link g_links[G_THREADS][G_ITER];
static atomic_int g_retire_done;
static _Thread_local unsigned long g_ctx_next, g_ctx_ran;
static unsigned long g_ctx_items[G_THREADS][64];

static unsigned long g_units(uintptr_t w) {
    return (unsigned long)(w / PC_HOLDS_ONE) + ((w & PC_HOLDS_SELF) ? 1 : 0);
}

static void g_ctx_run(void *item);

static void g_ctx_call(unsigned long *item) {
    if (pc_context_calls_too_deep()) {
        pc_context_run_later(item, g_ctx_run);
        return;
    }
    pc_context_call_begin();
    g_ctx_run(item);
    pc_context_call_end();
}

static void g_ctx_run(void *item) {
    unsigned long *it = item;
    REQUIRE(*it == g_ctx_next, "context run %lu, expected %lu", *it, g_ctx_next);
    g_ctx_next += 1;
    g_ctx_ran += 1;
    if (*it + 1 < 64) {
        g_ctx_call(it + 1); /* each run calls the next: nests to 16, then queues */
    }
}

static void g_prepare(unsigned long round) {
    (void)round;
    memset(&g_lin, 0, sizeof g_lin);
    memset(&g_p, 0, sizeof g_p);
    atomic_store(&g_refs, 0);
    atomic_store(&g_retire_done, 0);
}

static void g_play(unsigned me, unsigned long round) {
    /* holds: first hold takes a reference, last release drops it */
    for (unsigned i = 0; i < 50; i++) {
        if (!pc_holds_add_if_holding(&g_lin, PC_HOLDS_ONE)) {
            uintptr_t before = pc_holds_add(&g_lin, PC_HOLDS_ONE);
            if (g_units(before) == 0) {
                atomic_fetch_add(&g_refs, 1);
            }
        }
        spin_for((unsigned)(rnd() % 20));
        uintptr_t before = pc_holds_remove_one(&g_lin);
        if (g_units(before) == 1) {
            REQUIRE(atomic_fetch_sub(&g_refs, 1) >= 1, "reference dropped below zero");
        }
    }
    /* registry count bits vs a retirement's update of the low flags */
    if (me == 1) {
        for (unsigned k = 0; k < 100; k++) {
            REQUIRE(pc_tree_flags_set(&g_p, PC_TREE_RETIRING), "RETIRING already set");
            spin_for((unsigned)(rnd() % 30));
            pc_tree_flags_update(&g_p, PC_TREE_RETIRING, (k == 99) ? PC_TREE_RETIRED : 0);
        }
        atomic_store(&g_retire_done, 1);
    } else {
        for (unsigned i = 0; i < G_ITER; i++) {
            pc_children_push(&g_p, &g_links[me - 1][i]);
            uintptr_t f = pc_tree_flags_after_fence(&g_p);
            REQUIRE((f & PC_TREE_RETIRING) == 0, "after_fence returned RETIRING");
        }
    }
    /* context calls and slot runs, thread-local nesting */
    g_ctx_next = 0;
    g_ctx_ran = 0;
    for (unsigned i = 0; i < 64; i++) {
        g_ctx_items[me - 1][i] = i;
    }
    g_ctx_call(&g_ctx_items[me - 1][0]);
    REQUIRE(g_ctx_ran == 64, "context ran %lu of 64", g_ctx_ran);
    REQUIRE(pc_context_call_depth == 0, "context depth %u", pc_context_call_depth);
    (void)round;
}

static void g_check(unsigned long round) {
    (void)round;
    REQUIRE(atomic_load(&g_refs) == 0, "references kept: %ld", atomic_load(&g_refs));
    REQUIRE(pc_holds(&g_lin) == 0, "holds word %#lx", (unsigned long)pc_holds(&g_lin));
    uintptr_t f = pc_tree_flags(&g_p);
    REQUIRE((f >> PC_TREE_COUNT_SHIFT) == (uintptr_t)(G_THREADS - 1) * G_ITER,
            "count %lu after retirement updates", (unsigned long)(f >> PC_TREE_COUNT_SHIFT));
    REQUIRE((f & ((1u << PC_TREE_COUNT_SHIFT) - 1)) == PC_TREE_RETIRED, "flags %#lx",
            (unsigned long)f);
    unsigned n = 0;
    for (pc_link *l = pc_children_take(&g_p); l != NULL; l = l->next) {
        n++;
    }
    REQUIRE(n == (G_THREADS - 1) * G_ITER, "links %u", n);
}

/* ---- main ------------------------------------------------------------------------- */

int main(int argc, char **argv) {
    if (argc > 1) {
        multiplier = strtoul(argv[1], NULL, 10);
        if (multiplier == 0) {
            multiplier = 1;
        }
    }
    printf("# sizeof(pc_node) %zu align %zu; sizeof(pc_promise) %zu align %zu\n",
           sizeof(pc_node), _Alignof(pc_node), sizeof(pc_promise), _Alignof(pc_promise));
    test_b();
    test_f();
    run_crew("A observe x3 + prune + publish, give-ups, re-registration", 5, 300 * multiplier,
             a_prepare, a_play, a_check);
    printf("# A: registrations %lu fires %lu (inline %lu) releases %lu; prunes %lu, "
           "re-pushes %lu\n",
           atomic_load(&a_registrations), atomic_load(&a_fires), atomic_load(&a_inline_fires),
           atomic_load(&a_releases), atomic_load(&a_prunes_ok), atomic_load(&a_repushes));
    run_crew("C registry: pushers vs canceller vs pruner", 5, 300 * multiplier, c_prepare, c_play,
             c_check);
    printf("# C: reached by canceller %lu, by pruner %lu, pushers saw PUBLISHED %lu\n",
           atomic_load(&c_reach_by_canceller), atomic_load(&c_reach_by_pruner),
           atomic_load(&c_reach_by_self));
    run_crew("D trampoline from several threads", D_THREADS, 40 * multiplier, d_prepare, d_play,
             d_check);
    run_crew("E gate, countdown, once, words, holds Dekker, forwarding", E_THREADS,
             500 * multiplier, e_prepare, e_play, e_check);
    run_crew("G holds, retirement vs registry count, context nesting", G_THREADS,
             200 * multiplier, g_prepare, g_play, g_check);
    printf("all passed\n");
    return failures != 0;
}
