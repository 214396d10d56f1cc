/*
 * pc_promise.h: the promise state machine, the lock-free heart of CPromiseCore.
 *
 * One machine word (`state`) says everything about a promise:
 *
 *                    pc_publish (claim winner)
 *   PENDING ---------------------------------------> SETTLED|FIRING ------> SETTLED
 *   word = head of the observer     take the whole     word = outcome tag,   quiescent: a late
 *   stack (NULL when none), tag 0   stack in one CAS   late observers are    observer fires
 *      |        ^                                      still queued here     itself (pc_observe)
 *      | pc_prune: take the stack, put the rest back
 *      v        |
 *   PENDING|FIRING: a pruner holds the nodes it took; the word's stack is the nodes
 *   registered meanwhile; a publisher waits for the put-back
 *
 *
 *   outcome tags (low two bits):  PC_FULFILLED = 1, PC_REJECTED = 2, PC_CANCELLED = 3
 *   bit 2 (PC_STATE_FIRING):            the settler is still handing out observers; with
 *                                       no outcome: a pruner holds the stack (pc_prune)
 *   upper bits:                   head of an intrusive stack of pc_node (8-byte aligned)
 *
 * A second word (`claim`) elects the single settler among any number of racing
 * fulfil / reject / cancel calls:
 *
 *   FREE --pc_claim--> FULFILLED | REJECTED | CANCELLED         (fulfil, reject, cancel)
 *   FREE --pc_claim--> FOLLOWING --pc_claim--> an outcome        (resolve(with:), flatMap)
 *
 * The winner stores the outcome value (in memory the caller owns), then calls
 * pc_publish, whose release CAS makes that store visible to every thread that later
 * sees the outcome tag with an acquire load (pc_state, pc_observe).
 *
 * Observers fire in registration order: pc_publish reverses each stack it takes (the
 * kernel's llist_del_all + llist_reverse_order). While it fires one batch the word keeps
 * PC_STATE_FIRING, so an observer registered meanwhile joins the next batch instead of firing
 * itself ahead of earlier ones. Nodes are never removed one by one by a CAS on the word:
 * the settler takes the whole stack, and pc_prune takes it whole too, filters it privately
 * and puts the rest back in one CAS, so there is no ABA and no hazard pointers.
 *
 * Firing is stack-safe: pc_publish and pc_observe run inside a per-thread trampoline.
 * A node that wants to run work inline (an `.immediate` handler, adopting a followed
 * promise's outcome) calls pc_defer, and the outermost pc_publish / pc_observe /
 * pc_defer on the thread runs it after the current firing returns: chains of any
 * length settle in constant stack depth.
 *
 * Who may call what, and the progress guarantee of each call:
 *
 *   function        caller                           progress
 *   pc_observe      any thread, any time             lock-free (CAS retry only when another
 *                                                    registration or the settler moved the word)
 *   pc_claim        any thread, any time             wait-free (one CAS)
 *   pc_claimed      any thread, any time             wait-free (one load)
 *   pc_publish      only the thread whose pc_claim   lock-free (loops only while registrations
 *                   won an outcome, once             keep arriving during firing), except that
 *                                                    it waits out a prune in progress (one walk
 *                                                    of the nodes the pruner took)
 *   pc_prune        any thread holding the promise   lock-free (one pruner at a time; others
 *                                                    return false)
 *   pc_state        any thread, any time             wait-free (one load)
 *   pc_has_waiting_observers  any thread, any time   wait-free (one load)
 *   pc_defer        from inside a fire callback,     wait-free (thread-local)
 *                   or any thread to run a node now
 *   pc_keep_until_cascade_end  any thread (false     wait-free (thread-local; amortised
 *                   outside a trampoline scope)      O(1), an allocation past 32 kept)
 *   pc_cascade_keeps_last  any thread                wait-free (thread-local, two loads)
 *   pc_inline_*     any thread, begin/end paired     wait-free (one load, thread-local)
 *   pc_cascade_*    any thread, watch/end paired     wait-free (thread-local)
 *   pc_scope_opened_by  any thread                   wait-free (thread-local)
 *   pc_detach       only the owner's deinit          wait-free (one load)
 *
 * Synchronisation table (liburcu style): which calls need external synchronisation
 * against which. pc_claimed and pc_state are reads and race with nothing; pc_defer,
 * pc_keep_until_cascade_end, pc_inline_*, pc_cascade_* and pc_scope_opened_by touch only
 * the calling thread's trampoline.
 *
 *                   pc_observe  pc_claim  pc_publish  pc_prune    pc_state  pc_detach
 *   pc_observe      no          no        no          no          no        yes (owner alive)
 *   pc_claim        no          no        no          no          no        yes
 *   pc_publish      no          no        once only   no (waits)  no        yes
 *   pc_prune        no          no        no          no (false)  no        yes
 *   pc_state        no          no        no          no          no        yes
 *   pc_detach       -           -         -           -           -         exclusive
 *
 * A node belongs to whoever pushed it until it fires, or until a pruner's `gave_up`
 * callback says its observer gave up (the pruner then hands it to `release`); the fire
 * callback receives the node back and owns it again. The C side never dereferences
 * anything but `next` and `fire`.
 *
 * The words that hang off the same struct but serve cancellation (the registry, the tree
 * flags) are in pc_registry.h, with the holds of a derived promise's pc_lineage; helpers
 * only the overlay uses, in pc_overlay.h.
 *
 * Memory orderings. "Full" on a read-modify-write here means libatomic_ops' _full variant.
 * On the implementation libatomic_ops uses with gcc and clang (its generic one, built on
 * the compilers' atomic builtins: on AArch64 always, on x86-64 too), AO_fetch_and_add_full
 * and AO_nop_full are seq_cst, but AO_compare_and_swap_full and
 * AO_fetch_compare_and_swap_full are acq_rel. Such a CAS orders the caller's accesses as a
 * release and an acquire do, but not a store before a later load of another word. So no
 * Dekker pairing (each side writes one word, then reads the other side's, and one of them
 * must see the other's write) rests on a CAS alone: each side either calls pc_fence
 * (seq_cst) between its write and its read, or, right after a read-modify-write, reads
 * with a seq_cst load (pc_state_after_hold, pc_holds_after_publish,
 * pc_word_load_after_rmw, pc_word_take_marked). The second form rests on how compilers
 * map C11 atomics onto the targets Swift supports: an acq_rel and a seq_cst
 * read-modify-write are the same instructions there (x86-64: one locked instruction, a
 * full barrier; AArch64: LDAXR/STLXR or CASAL), and a seq_cst load after them cannot be
 * satisfied before their store is visible (a plain load after a locked instruction; LDAR
 * after STLXR or CASAL). C11 alone promises that only for a seq_cst read-modify-write.
 * A relaxed or acquire load (LDR; LDAPR on ARMv8.3 and later) closes no such pairing.
 * Where the code fences, the reason is on the call; the x86-64 test machines cannot show
 * an ordering missing here (every locked instruction is a full barrier there).
 *
 * The protocol is small enough to model-check: the spin model Verification/core.pml names
 * these functions step by step (`make verify`; Verification/README.md says what it proves).
 */
#ifndef PC_PROMISE_H
#define PC_PROMISE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The compare-and-swaps of the inline fast paths below (pc_observe, pc_claim) are
 * libatomic_ops', as in CPromiseCore.c. */
#include <atomic_ops.h>

/* Nullability annotations are clang's; other compilers (gcc builds the C tests) skip them. */
#if !defined(__clang__)
#define _Nonnull
#define _Nullable
#endif

/* 8-byte alignment for a node (its address's low three bits carry tags, also on 32-bit
 * targets): C11's keyword, or C++'s, for a header both include. */
#ifdef __cplusplus
#define PC_ALIGNED_8 alignas(8)
#else
#define PC_ALIGNED_8 _Alignas(8)
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Outcome tags: the low two bits of a settled state word and the claim word. */
#define PC_PENDING 0u
#define PC_FULFILLED 1u
#define PC_REJECTED 2u
#define PC_CANCELLED 3u
/* Claim word only: the promise is locked to follow another one. */
#define PC_CLAIM_FOLLOWING 4u
/* Claim word only: nobody has claimed the promise yet. */
#define PC_CLAIM_FREE 0u
/* The outcome tag's bits in the state word. */
#define PC_OUTCOME_MASK ((uintptr_t)3u)
/* The state word's bit 2: a batch is firing (or, with no outcome, a pruner holds the stack). */
#define PC_STATE_FIRING ((uintptr_t)4u)
/* The state word's tag bits: the outcome and PC_STATE_FIRING (a node's address is 8-aligned). */
#define PC_TAG_MASK ((uintptr_t)7u)

typedef struct pc_node pc_node;
typedef struct pc_promise pc_promise;

/*
 * Called once per registration with `source` = the promise that settled (from
 * pc_publish, or from pc_observe when the promise had already settled), and again with
 * `source` = NULL for each pc_defer of the node.
 */
typedef void (*pc_fire_fn)(pc_node *_Nonnull node, pc_promise *_Nullable source);

/* An intrusive observer: lives inside the object that wants to be notified. */
struct pc_node {
    PC_ALIGNED_8 pc_node *_Nullable next; /* stack / trampoline link; owned by the list holder */
    pc_fire_fn _Nullable fire;           /* set before pc_observe / pc_defer */
};

/* A link in a cancellation registry (pc_registry.h): a stack node that is never fired, so
 * it needs no callback. */
typedef struct pc_link pc_link;
struct pc_link {
    pc_link *_Nullable next; /* owned by whoever holds the registry's stack */
};

/* The C state of one promise. Zero-initialised means pending, unclaimed, no observers. */
struct pc_promise {
    uintptr_t state;    /* atomic: observer stack head | PC_STATE_FIRING | outcome */
    uintptr_t claim;    /* atomic: PC_CLAIM_FREE, PC_CLAIM_FOLLOWING or an outcome */
    pc_node node;       /* this promise's own node: a derived promise's, for observing its
                           parent or followee; a root's, for the overlay's first
                           `whenComplete`, so that observer needs no allocation (NIO's
                           CallbackList keeps its first callback inline too), its user
                           elected with pc_tree_flags_set(PC_TREE_FIRST_OBSERVER) */
    uintptr_t children; /* atomic: cancellation registry, a stack of link nodes */
    uintptr_t tree_flags;   /* atomic: PC_TREE_* bits, and above them (PC_TREE_COUNT_SHIFT)
                           the number of links pushed here (approximate, for pruning) */
    uintptr_t payload[3]; /* not atomic, never touched here: the overlay's inline value
                             slot, written by the claim winner before pc_publish and read
                             only after an acquire has seen PC_FULFILLED */
    uintptr_t rare;       /* atomic, never touched here: the overlay's side object for the
                             state few promises need (a forwarded cancel's reason, the list
                             of waiters that may give up, a root's followee link), made on
                             first use and published once with pc_word_publish */
};

/*
 * The C state only a derived promise has (a root has no parent), kept by the overlay after
 * its other fields, in the derived promise's class: a root does not pay for it.
 */
typedef struct pc_lineage {
    uintptr_t holds;  /* atomic: PC_HOLDS_* bits and count, why the overlay keeps this
                         promise's parent alive (see pc_holds_add) */
    uintptr_t parent; /* never touched here: the overlay's link to the promise this one
                         was derived from, whose memory (not the promise) it holds;
                         written once, before the promise is shared */
    pc_link link;     /* this promise's link in its parent's registry (`children`), once
                         PC_TREE_LINKED */
    uintptr_t followee; /* atomic, never touched here: the overlay's link to the promise
                           this one follows, whose memory it holds; bit 1 says whether a
                           cancel is forwarded to it (a root, which follows only through
                           `resolve(with:)`, keeps its link in its rare state) */
} pc_lineage;

/*
 * Registers `node` on `promise`. Pending (or still firing): pushes it and returns; the
 * settler fires it later, in registration order. Settled and quiescent: fires it at
 * once on this thread, node->fire(node, promise), before returning. The caller keeps
 * `promise` alive until this returns (see pc_scope_opened_by).
 */
void pc_observe_slow(pc_promise *_Nonnull promise, pc_node *_Nonnull node);

/*
 * Inline, the common case: a pending promise with nothing firing, whose word does not
 * change between the load and the push (one acquire load, one release CAS, as in
 * pc_observe_slow, which does all the rest: a settled promise, a batch firing, a failed
 * CAS, a pruner holding the stack, a node it must refuse).
 */
static inline void pc_observe(pc_promise *_Nonnull promise, pc_node *_Nonnull node) {
    /* acquire: as pc_observe_slow's first load (a settled tag seen makes the outcome
     * visible; here only a pending word goes on, and its acquire costs nothing more). */
    uintptr_t seen = __atomic_load_n(&promise->state, __ATOMIC_ACQUIRE);
    if ((seen & PC_TAG_MASK) == 0 && ((uintptr_t)node & PC_TAG_MASK) == 0 && node->fire != NULL) {
        node->next = (pc_node *)seen;
        /* release: publishes node->next, node->fire and the object around the node before
         * the node is reachable; pairs with the acquire half of pc_publish's taking CAS. */
        if (AO_compare_and_swap_release((volatile AO_t *)&promise->state, (AO_t)seen, (AO_t)(uintptr_t)node)) {
            return;
        }
    }
    pc_observe_slow(promise, node);
}

/*
 * Moves the claim word from `expected` to `desired` in one CAS; true for the one caller
 * that did. pc_claim(p, PC_CLAIM_FREE, outcome) elects the settler among racing resolvers.
 * Full (acq_rel, see "Memory orderings" above): what a caller stored before a successful
 * claim is visible to a caller whose later claim on the same word succeeds (FREE ->
 * FOLLOWING, then FOLLOWING -> x). It is no StoreLoad barrier: a caller that must see
 * another thread's write after its claim fences (pc_fence) first.
 */
static inline bool pc_claim(pc_promise *_Nonnull promise, uintptr_t expected, uintptr_t desired) {
    /* full (acq_rel, see above): the claim elects one settler (the outcome it then stores
     * is published by its own release CAS in pc_publish); release publishes what the
     * caller stored before it to a caller whose later claim on the word succeeds, and
     * acquire keeps the winner's later accesses after the election. The followee link,
     * stored after a claim to FOLLOWING, is not published by it: the follower and a
     * canceller that takes over from FOLLOWING each fence between their write and their
     * read of the other's word (the overlay's `follow` and `settleFailureClaimingFrom`).
     * Inline: every settle claims, and the call cost as much as the CAS around it. */
    return AO_compare_and_swap_full((volatile AO_t *)&promise->claim, (AO_t)expected, (AO_t)desired) != 0;
}

/*
 * The loads below are inline (every handler's step makes several): the compiler's atomic
 * builtins (gcc or clang, which libatomic_ops and the thread-local words here need too),
 * on the same words libatomic_ops' read-modify-writes use in CPromiseCore.c.
 */

/* The claim word as last seen by this thread. No ordering: a hint for deciding what to
 * try; every decision taken on it is confirmed by a pc_claim CAS. */
static inline uintptr_t pc_claimed(const pc_promise *_Nonnull promise) {
    return __atomic_load_n(&promise->claim, __ATOMIC_RELAXED);
}

/*
 * Publishes the outcome in the claim word and fires every observer on this thread, in
 * registration order, then any that registered while firing (first waiting out a prune
 * that holds the stack: see pc_prune). Only for the claim winner, once; the outcome value
 * must be stored before this call. Aborts if the claim holds no outcome. The caller keeps
 * `promise` alive until this returns (see pc_scope_opened_by).
 */
void pc_publish(pc_promise *_Nonnull promise);

/*
 * Pruning: observers that gave up leave a pending promise. A registration stays on the
 * stack until the promise settles, so an observer that stopped caring (a slot of a
 * combinator that settled without this input) would otherwise stay there, and a promise
 * that lives long and is raced over and over would grow without bound.
 *
 * pc_prune takes the whole stack, marking the word PENDING|PC_STATE_FIRING ("a pruner
 * holds the nodes": no outcome yet, firing is not free), asks `gave_up(node, context)` for
 * each node, newest first, and puts the nodes it kept back, in their order, below any
 * registered meanwhile; then it calls `release(node, context)` for each node that gave up,
 * which is the callback's from then on (the core never touches it again). `gave_up` must
 * only look (it runs while the pruner holds the stack); `release` may do anything but
 * register on, settle or prune this promise. Registrations during a prune push as usual.
 * A publisher that finds a prune in progress waits until the nodes are back (the walk of
 * `gave_up` over them and one CAS), then fires every node itself, in registration order,
 * on its own thread, as always: the one wait on the settling path, in exchange for a
 * stack that never holds more than a bounded number of observers that gave up. Returns
 * false, doing nothing, when the promise is settled, still firing, or another prune holds
 * the stack; true otherwise, with the number of nodes kept in `*kept_count`.
 */
typedef bool (*pc_prune_test_fn)(pc_node *_Nonnull node, void *_Nullable context);
typedef void (*pc_prune_release_fn)(pc_node *_Nonnull node, void *_Nullable context);
bool pc_prune(pc_promise *_Nonnull promise, pc_prune_test_fn _Nonnull gave_up,
              pc_prune_release_fn _Nonnull release, void *_Nullable context,
              size_t *_Nonnull kept_count);

/* PC_PENDING, or the published outcome. acquire: pairs with the release half of the
 * publishing CAS in pc_publish; once the tag is seen, the outcome value stored before it
 * is visible. */
static inline uintptr_t pc_state(const pc_promise *_Nonnull promise) {
    return __atomic_load_n(&promise->state, __ATOMIC_ACQUIRE) & PC_OUTCOME_MASK;
}

/*
 * Whether observers are queued and not yet handed out: the stack is not empty (pending,
 * or settled and still firing late registrations), or a pruner holds it (then it says
 * true whatever the pruner will keep). A snapshot for descriptions. It says
 * whether, not how many: counting would walk nodes that the settler may be firing, and
 * their owners freeing, at that moment; and a counter kept beside the stack would cost
 * every registration an atomic add.
 */
bool pc_has_waiting_observers(const pc_promise *_Nonnull promise);

/*
 * Runs node->fire(node, NULL) on this thread: after the current fire callback returns
 * when called from one (iteration instead of recursion), otherwise at once.
 */
void pc_defer_outside_scope(pc_node *_Nonnull node);

/*
 * Keeps `item` until the current cascade ends: `release(item)` runs on this thread once
 * the scope's deferred work is all done, newest first, still before the outermost
 * pc_publish / pc_observe / pc_defer / pc_inline_end returns; or returns false, keeping
 * nothing, when the thread is in no scope. The overlay keeps the path above a cascade of inline
 * handlers alive this way while they may still look up through it. No allocation for
 * the first 32 references kept; past that a heap buffer doubles as it grows, and the
 * thread keeps it for the next cascade up to 1,024 entries (16 KiB on 64-bit targets),
 * freed when the thread exits.
 */
typedef void (*pc_release_fn)(void *_Nonnull item);
/* Runs queued work (pc_context_run_later, pc_overlay.h). */
typedef void (*pc_run_fn)(void *_Nonnull item);

/*
 * The per-thread trampoline: the FIFO of deferred nodes, the references kept until the
 * cascade ends, and the depth of the pc_publish / pc_observe / pc_inline_begin scopes
 * active on this thread (the one that brings it back to zero drains both). Only its own
 * thread touches it: no atomics. Declared here so that pc_defer and
 * pc_keep_until_cascade_end, which every inline step of a chain calls, are inline: their
 * common case is a few thread-local loads and stores, where a call cost about as much
 * again. The rest (draining, growing the buffer) stays in CPromiseCore.c.
 */
typedef struct {
    pc_release_fn _Nullable release;
    void *_Nullable item;
} pc_kept;

#define PC_KEPT_INLINE 32 /* kept references without an allocation */

typedef struct {
    pc_node *_Nullable head;
    pc_node *_Nullable tail;
    pc_kept *_Nullable kept; /* kept_inline, a larger heap buffer, or NULL before first use */
    size_t kept_count;
    size_t kept_capacity; /* of `kept`: 0 before first use */
    unsigned depth;
    pc_kept kept_inline[PC_KEPT_INLINE];
} pc_trampoline_state;

#if defined(__clang__)
__attribute__((swift_private))
#endif
#if defined(__GNUC__) || defined(__clang__)
extern __thread pc_trampoline_state pc_trampoline;
#else
extern _Thread_local pc_trampoline_state pc_trampoline;
#endif

/* pc_defer outside any scope (it drains at once), or for a node with no callback (it
 * aborts). */
void pc_defer_outside_scope(pc_node *_Nonnull node);

static inline void pc_defer(pc_node *_Nonnull node) {
    if (node->fire == NULL || pc_trampoline.depth == 0) {
        pc_defer_outside_scope(node);
        return;
    }
    node->next = NULL;
    if (pc_trampoline.tail != NULL) {
        pc_trampoline.tail->next = node;
    } else {
        pc_trampoline.head = node;
    }
    pc_trampoline.tail = node;
}

/* pc_keep_until_cascade_end when the buffer is full: the inline buffer first, then a heap
 * buffer doubling each time. */
bool pc_keep_growing(void *_Nonnull item, pc_release_fn _Nonnull release);

static inline bool pc_keep_until_cascade_end(void *_Nonnull item, pc_release_fn _Nonnull release) {
    if (pc_trampoline.depth == 0) {
        return false;
    }
    size_t count = pc_trampoline.kept_count;
    if (count == pc_trampoline.kept_capacity) {
        return pc_keep_growing(item, release);
    }
    pc_trampoline.kept[count].release = release;
    pc_trampoline.kept[count].item = item;
    pc_trampoline.kept_count = count + 1;
    return true;
}

/*
 * Whether the newest item this thread keeps until its cascade ends is `item`, kept with
 * `release`: then it stays kept, with the reference that keep holds, until this thread's
 * cascade ends (only this thread releases it). The overlay counts that reference when it
 * decides whether only the cascade still holds a promise. False outside a scope.
 */
bool pc_cascade_keeps_last(const void *_Nonnull item, pc_release_fn _Nonnull release);

/*
 * The cascade watch: whether the handler this thread is about to run settles its own
 * promise with a publish that fires `.immediate` children (which run later in the same
 * cascade). pc_cascade_watch(p) starts watching p and returns a token for the watch it
 * replaces (the promise watched before, and whether it had fired); a fire callback calls
 * pc_cascade_fired_inline(source) when it defers an `.immediate` child of `source`;
 * pc_cascade_watch_end(token) returns what the watch saw (PC_WATCH_* bits), and restores
 * the watch the token saved. Thread-local: only this thread's fires count (a promise
 * settled by another thread meanwhile fired its children there).
 *
 * The watch also hands on a reference. A deferred node's owner runs its handler kept
 * alive by the one reference its node carried, which the frame running it releases when
 * the handler returns; each `.immediate` child its publish fires needs a reference to it
 * (its parent, held until the child's handler has read the outcome), and their handlers
 * run later, after that frame returned. So such a frame watches with
 * pc_cascade_watch_offering: the first child to call pc_cascade_fired_inline_taking(source)
 * takes the frame's reference (true) instead of retaining, and the frame, seeing
 * PC_WATCH_OFFERED gone, does not release it: one retain and one release fewer per step
 * of an inline chain, both atomic read-modify-writes.
 */
#define PC_WATCH_FIRED 1u   /* the watched promise fired an `.immediate` child */
#define PC_WATCH_OFFERED 2u /* its frame's reference is on offer, not taken yet */

/* Inline (one thread-local word: the watched promise, word-aligned, and the PC_WATCH_*
 * bits), since the cascade watch runs on every inline step of a chain. */
#if defined(__GNUC__) || defined(__clang__)
extern __thread uintptr_t pc_cascade_watch_word; /* C and C++ alike: no TLS wrapper function */
#else
extern _Thread_local uintptr_t pc_cascade_watch_word;
#endif

#define PC_WATCH_BITS ((uintptr_t)(PC_WATCH_FIRED | PC_WATCH_OFFERED))

static inline uintptr_t pc_cascade_watch(const pc_promise *_Nonnull promise) {
    uintptr_t token = pc_cascade_watch_word;
    pc_cascade_watch_word = (uintptr_t)promise;
    return token;
}

static inline uintptr_t pc_cascade_watch_offering(const pc_promise *_Nonnull promise) {
    uintptr_t token = pc_cascade_watch_word;
    pc_cascade_watch_word = (uintptr_t)promise | PC_WATCH_OFFERED;
    return token;
}

static inline void pc_cascade_fired_inline(const pc_promise *_Nonnull source) {
    if ((pc_cascade_watch_word & ~PC_WATCH_BITS) == (uintptr_t)source) {
        pc_cascade_watch_word |= PC_WATCH_FIRED;
    }
}

/* pc_cascade_fired_inline, for a child that takes the reference on offer if there is one
 * (true: the caller owns that reference from now on). */
static inline bool pc_cascade_fired_inline_taking(const pc_promise *_Nonnull source) {
    uintptr_t word = pc_cascade_watch_word;
    if ((word & ~PC_WATCH_BITS) != (uintptr_t)source) {
        return false;
    }
    pc_cascade_watch_word = (word & ~(uintptr_t)PC_WATCH_OFFERED) | PC_WATCH_FIRED;
    return (word & PC_WATCH_OFFERED) != 0;
}

static inline uintptr_t pc_cascade_watch_end(uintptr_t token) {
    uintptr_t seen = pc_cascade_watch_word & PC_WATCH_BITS;
    pc_cascade_watch_word = token;
    return seen;
}

/*
 * Whether a call on `promise` (its pc_publish or pc_observe) opened this thread's
 * outermost trampoline scope, which is still open (a scope opened by pc_inline_begin has
 * no opener: false for every promise). Then the caller of that call
 * holds `promise` until the scope has run all the work deferred in it, so a fire callback
 * that defers work reading `promise` needs no reference of its own for that work: one
 * retain and one release fewer per deferred observer when a promise is settled or observed
 * from outside any firing (the common case: `p.fulfill(x)` in the code that made `p`).
 * Inline (a thread-local word: the opener, 0 while no scope is open): it runs once per
 * deferred observer.
 */
#if defined(__GNUC__) || defined(__clang__)
extern __thread uintptr_t pc_scope_opener_word;
#else
extern _Thread_local uintptr_t pc_scope_opener_word;
#endif

static inline bool pc_scope_opened_by(const pc_promise *_Nonnull promise) {
    return pc_scope_opener_word == (uintptr_t)promise;
}

/*
 * For an observer that would fire at once (the promise settled and quiescent) and
 * defer itself: lets the caller run it inline instead, with no node. Returns the
 * outcome (acquire: its value is visible) and opens a trampoline scope, if this thread
 * is in no pc_publish / pc_observe / pc_defer scope and the promise is settled and
 * quiescent; then the caller runs its observer and calls pc_inline_end, which runs the
 * work the observer deferred, as pc_observe would have. Otherwise returns PC_PENDING
 * and opens nothing: the caller registers a node as usual. The scope records no opener
 * (pc_scope_opened_by is false in it): work deferred in it that reads `promise` holds a
 * reference of its own.
 */
uintptr_t pc_inline_begin(const pc_promise *_Nonnull promise);
void pc_inline_end(void);

/*
 * For the owner's deinit only: the observers still registered on a promise that never
 * settled (NULL if none), linked through `next`, so the owner can release them. Their
 * nodes are the caller's from here on; they are not fired. Empties the list, so a
 * second call returns NULL.
 */
pc_node *_Nullable pc_detach(pc_promise *_Nonnull promise);

#ifdef __cplusplus
}
#endif

#endif /* PC_PROMISE_H */
