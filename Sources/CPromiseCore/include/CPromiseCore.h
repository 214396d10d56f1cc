/*
 * CPromiseCore: the lock-free heart of a promise.
 *
 * One machine word (`state`) says everything about a promise:
 *
 *                    pc_publish (claim winner)
 *   PENDING ---------------------------------------> SETTLED|FIRING ------> SETTLED
 *   word = head of the observer     take the whole     word = outcome tag,   quiescent: a late
 *   stack (NULL when none), tag 0   stack in one CAS   late observers are    observer fires
 *                                                      still queued here     itself (pc_observe)
 *
 *   outcome tags (low two bits):  PC_FULFILLED = 1, PC_REJECTED = 2, PC_CANCELLED = 3
 *   bit 2 (PC_FIRING):            the settler is still handing out observers
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
 * PC_FIRING, so an observer registered meanwhile joins the next batch instead of firing
 * itself ahead of earlier ones. Nodes are never removed one by one: no ABA, no hazard
 * pointers.
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
 *   pc_publish      only the thread whose pc_claim   lock-free (loops only while registrations
 *                   won an outcome, once             keep arriving during firing)
 *   pc_state        any thread, any time             wait-free (one load)
 *   pc_defer        from inside a fire callback,     wait-free (thread-local)
 *                   or any thread to run a node now
 *   pc_inline_*     any thread, begin/end paired     wait-free (one load, thread-local)
 *   pc_detach       only the owner's deinit          wait-free (one load)
 *   pc_children_*   any thread, any time             lock-free (push, take: CAS loops);
 *   pc_family_set                                    forget, pc_family: wait-free
 *   pc_count_down   any thread                       wait-free (one fetch-and-sub)
 *   pc_forwarding_* any thread                       wait-free (one load or fetch-and-add)
 *   pc_once         any thread                       wait-free (one CAS)
 *   pc_fence        any thread                       wait-free (one fence)
 *   pc_word_lock    any thread, cold paths only      blocking: a spin lock (then yields) whose
 *                                                    holders run a few instructions
 *   pc_word_load,   any thread (see "locked words")  wait-free (one load or store)
 *   pc_word_store,
 *   pc_word_unlock
 *
 * Synchronisation table (liburcu style): which calls need external synchronisation
 * against which.
 *
 *                   pc_observe  pc_claim  pc_publish  pc_state  pc_detach
 *   pc_observe      no          no        no          no        yes (owner must be alive)
 *   pc_claim        no          no        no          no        yes
 *   pc_publish      no          no        once only   no        yes
 *   pc_detach       -           -         -           -         exclusive
 *
 * A node belongs to whoever pushed it until it fires; the fire callback receives the
 * node back and owns it again. The C side never dereferences anything but `next` and
 * `fire`.
 *
 * The protocol is small enough to model-check: the spin model Verification/core.pml names
 * these functions step by step (`make verify`; Verification/README.md says what it proves).
 */
#ifndef CPROMISECORE_H
#define CPROMISECORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Nullability annotations are clang's; other compilers (gcc builds the C tests) skip them. */
#if !defined(__clang__)
#define _Nonnull
#define _Nullable
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
#define PC_FOLLOWING 4u
/* Claim word only: nobody has claimed the promise yet. */
#define PC_FREE 0u

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
    _Alignas(8) pc_node *_Nullable next; /* stack / trampoline link; owned by the list holder */
    pc_fire_fn _Nullable fire;           /* set before pc_observe / pc_defer */
};

/* The C state of one promise. Zero-initialised means pending, unclaimed, no observers. */
struct pc_promise {
    uintptr_t state;    /* atomic: observer stack head | PC_FIRING | outcome */
    uintptr_t claim;    /* atomic: PC_FREE, PC_FOLLOWING or an outcome */
    pc_node node;       /* this promise's own node, for observing its parent or followee */
    uintptr_t children; /* atomic: cancellation registry, a stack of link nodes */
    uintptr_t family;   /* atomic: PC_FAMILY_* bits, and from bit 4 up the number of
                           links pushed here (approximate, for pruning) */
    uintptr_t holds;    /* atomic: PC_HOLDS_* bits and count, why the overlay keeps this
                           promise's parent alive (see pc_holds_add) */
    uintptr_t payload[3]; /* not atomic, never touched here: the overlay's inline value
                             slot, written by the claim winner before pc_publish and read
                             only after an acquire has seen PC_FULFILLED */
    uintptr_t parent;     /* never touched here: the overlay's link to the promise this one
                             was derived from, whose memory (not the promise) it holds;
                             written once, before the promise is shared */
    uintptr_t followee;   /* atomic, never touched here: the overlay's link to the promise
                             this one follows, whose memory it holds; bit 1 says whether a
                             cancel is forwarded to it */
    pc_node first_observer; /* a node for the overlay's first `whenComplete` on a root, so
                               that observer needs no allocation (NIO's CallbackList keeps
                               its first callback inline too); its user is elected with
                               pc_family_set(PC_FAMILY_FIRST_OBSERVER). A non-root (which
                               never has that observer) uses it instead as its link in its
                               parent's registry (`children`), once PC_FAMILY_LINKED */
};

/*
 * Registers `node` on `promise`. Pending (or still firing): pushes it and returns; the
 * settler fires it later, in registration order. Settled and quiescent: fires it at
 * once on this thread, node->fire(node, promise), before returning.
 */
void pc_observe(pc_promise *_Nonnull promise, pc_node *_Nonnull node);

/*
 * Moves the claim word from `expected` to `desired` in one CAS; true for the one caller
 * that did. pc_claim(p, PC_FREE, outcome) elects the settler among racing resolvers.
 * Full barrier: what a caller stored before a successful claim is visible to a caller
 * whose later claim on the same word succeeds (FREE -> FOLLOWING, then FOLLOWING -> x).
 */
bool pc_claim(pc_promise *_Nonnull promise, uintptr_t expected, uintptr_t desired);

/* The claim word as last seen by this thread (no ordering: a hint for deciding what to try). */
uintptr_t pc_claimed(const pc_promise *_Nonnull promise);

/*
 * Publishes the outcome in the claim word and fires every observer, in registration
 * order, then any that registered while firing. Only for the claim winner, once; the
 * outcome value must be stored before this call. Aborts if the claim holds no outcome.
 */
void pc_publish(pc_promise *_Nonnull promise);

/* PC_PENDING, or the published outcome (acquire: the outcome value is then visible). */
uintptr_t pc_state(const pc_promise *_Nonnull promise);

/*
 * Runs node->fire(node, NULL) on this thread: after the current fire callback returns
 * when called from one (iteration instead of recursion), otherwise at once.
 */
void pc_defer(pc_node *_Nonnull node);

/*
 * Runs node->fire(node, NULL) on this thread once the current scope's deferred work is
 * all done, newest first, still before the outermost pc_publish / pc_observe returns; or
 * returns false, doing nothing, when the thread is in no scope. The overlay keeps the
 * promises of a cascade of inline handlers alive until the cascade ends this way.
 */
bool pc_defer_late(pc_node *_Nonnull node);

/*
 * For an observer that would fire at once (the promise settled and quiescent) and
 * defer itself: lets the caller run it inline instead, with no node. Returns the
 * outcome (acquire: its value is visible) and opens a trampoline scope, if this thread
 * is in no pc_publish / pc_observe / pc_defer scope and the promise is settled and
 * quiescent; then the caller runs its observer and calls pc_inline_end, which runs the
 * work the observer deferred, as pc_observe would have. Otherwise returns PC_PENDING
 * and opens nothing: the caller registers a node as usual.
 */
uintptr_t pc_inline_begin(const pc_promise *_Nonnull promise);
void pc_inline_end(void);

/*
 * The cancellation registry: links to descendants that are still in flight after this
 * promise settled (handlers queued on a context, children following another promise),
 * so that a later cancel can reach them. A Treiber stack that, unlike the observer
 * stack, outlives settling. Push is lock-free; take removes the whole stack at once, so
 * nodes are never unlinked one by one (no ABA). Returns the number of links pushed so far
 * (approximate under races; used only to decide when to prune).
 */
uintptr_t pc_children_push(pc_promise *_Nonnull promise, pc_node *_Nonnull link);

/* Takes the whole registry (newest first, NULL if empty); the caller owns the nodes. */
pc_node *_Nullable pc_children_take(pc_promise *_Nonnull promise);

/* Lowers the registry's count after the caller dropped `count` links it had taken. */
void pc_children_forget(pc_promise *_Nonnull promise, uintptr_t count);

/* Bits of the `family` word. */
#define PC_FAMILY_LINKED 1u           /* linked into the parent's registry */
#define PC_FAMILY_CANCEL_CLAIMED 2u   /* a cancel of the settled promise is being forwarded */
#define PC_FAMILY_FIRST_OBSERVER 8u   /* first_observer is taken (never cleared) */
#define PC_FAMILY_COUNT_SHIFT 4u      /* the registry's link count sits above the four bits */
#define PC_FAMILY_CANCEL_PUBLISHED 4u /* ...and its reason is stored: descendants that show up
                                         in the registry later must be cancelled too */

/*
 * Sets `bit` in the family word; true for the one call that set it. Full barrier: a
 * canceller's PUBLISHED store is ordered before its pc_children_take, and pairs with the
 * full barrier that pc_children_push ends with, so a link pushed concurrently is either
 * taken by the canceller or sees PUBLISHED in the pusher's following pc_family load.
 */
bool pc_family_set(pc_promise *_Nonnull promise, uintptr_t bit);

/* The family word (acquire: a PUBLISHED bit seen makes the stored reason visible). */
uintptr_t pc_family(const pc_promise *_Nonnull promise);

/*
 * The holds word: what keeps a settled promise's parent alive while a descendant is still
 * in flight, so that a cancel from above can still reach that descendant through the
 * registries on its path. The overlay decides what a hold is (a strong reference to the
 * parent, taken on the first hold and dropped with the last); this word only counts:
 * PC_HOLDS_SELF is the promise's own hold while it is in flight itself (set once, cleared
 * once by pc_holds_clear_self), each PC_HOLDS_ONE a descendant's, and PC_HOLDS_GONE says
 * the parent was found dead, so there is nothing to hold any more. Every operation is a
 * full barrier: a promise that sets SELF and then reads its state pairs with the publisher
 * that CASes the state and then reads this word (Dekker: one of them sees the other).
 */
#define PC_HOLDS_SELF 1u
#define PC_HOLDS_GONE 2u
#define PC_HOLDS_ONE 4u

/* Adds `delta` only if the word already holds something; true if it did (no transition). */
bool pc_holds_add_if_holding(pc_promise *_Nonnull promise, uintptr_t delta);

/* Adds `delta` (PC_HOLDS_SELF or PC_HOLDS_ONE) and returns the word before. */
uintptr_t pc_holds_add(pc_promise *_Nonnull promise, uintptr_t delta);

/* Removes one PC_HOLDS_ONE and returns the word before. Aborts on underflow. */
uintptr_t pc_holds_remove_one(pc_promise *_Nonnull promise);

/* Clears PC_HOLDS_SELF if it is set and returns the word before (SELF set in it: this
 * call cleared it). */
uintptr_t pc_holds_clear_self(pc_promise *_Nonnull promise);

/* Sets PC_HOLDS_GONE (the parent was found dead: it stays dead). */
void pc_holds_mark_gone(pc_promise *_Nonnull promise);

/* The holds word (acquire). */
uintptr_t pc_holds(const pc_promise *_Nonnull promise);

/*
 * The forwarding epoch: one process-wide word that brackets every cancel forwarded through
 * an already settled promise (pc_forwarding_begin before its PUBLISHED bit is set,
 * pc_forwarding_end after). Low bits count the forwards in progress, the rest is an epoch
 * that every end advances, so any begin or end changes the word.
 *
 * A handler's child that claimed its outcome reads the word (pc_forwarding_epoch) and
 * compares it with the value its parent recorded at its own claim: equal and with no
 * forward in progress means no PUBLISHED bit appeared on any ancestor in between, so the
 * parent's "no cancel above me" still holds and only the parent itself needs a look. A
 * different value (rare: a cancel of a settled promise ran somewhere meanwhile) sends the
 * child up its ancestors. This is what lets a cancel of a settled promise reach a
 * descendant whose handler is already running and that is in no registry.
 *
 * Written only by cancels of settled promises (rare); read by every handler's claim, a
 * load of a line that stays shared in every cache.
 */
#define PC_FORWARDING_ACTIVE_MASK 0xFFFFFu /* forwards in progress (up to about a million) */
#define PC_FORWARDING_EPOCH_ONE 0x100000u

/* Before a forwarded cancel sets PC_FAMILY_CANCEL_PUBLISHED. Full barrier. */
void pc_forwarding_begin(void);

/* After that bit is set. Full barrier: a reader that sees the new word sees the bit. */
void pc_forwarding_end(void);

/* The word; call after the claim CAS (acquire: pairs with pc_forwarding_end). */
uintptr_t pc_forwarding_epoch(void);

/*
 * Lowers a countdown word by one and returns the new value: the combinators' lock-free
 * aggregation (the call that reaches zero finishes the aggregate). Full barrier: the
 * release half publishes the caller's slot writes, the acquire half lets the caller that
 * reaches zero see every earlier caller's. Aborts on underflow.
 */
uintptr_t pc_count_down(uintptr_t *_Nonnull counter);

/*
 * A one-shot election: sets *flag from 0 to 1 and returns true for the one caller that
 * did. `await p.value` uses it to decide between the promise's outcome and the awaiting
 * Task's cancellation. Full barrier: what the winner stored before is visible to whoever
 * later acquires it through pc_count_down.
 */
bool pc_once(uintptr_t *_Nonnull flag);

/*
 * A full memory fence (StoreLoad included). Cycle detection's Dekker pairing: a promise
 * that starts following another stores its followee link, fences, then reads the links
 * of the promises it would follow; of two promises linking to each other at once, at
 * least one sees the other's link, so no cycle closes unseen.
 */
void pc_fence(void);

/*
 * The state of one `await` on a promise: an observer node plus an election (`decided`,
 * pc_once) between the outcome and the Task's cancellation, and a countdown from 2
 * (`remaining`, pc_count_down) that the decision and the installed continuation both
 * lower; whoever reaches zero resumes the awaiting Task. Zero-initialised except
 * `remaining`, which starts at 2.
 */
typedef struct pc_waiter {
    pc_node node;
    uintptr_t decided;
    uintptr_t remaining;
} pc_waiter;

/*
 * Locked words: a reference that does not keep its target alive and never dangles.
 *
 * The word holds a pointer to an object (or 0) and, in bit 0 (PC_WORD_LOCKED), a spin
 * lock. The lock guards exactly one thing: the target's memory is not freed while a
 * thread holds it. The protocol, which the caller follows (the Swift overlay, with its
 * runtime's reference counts):
 *
 *   reader:  load the word; 0 means no target. Otherwise pc_word_lock, try to take a
 *            reference that fails once the target has begun dying (swift_tryRetain),
 *            pc_word_unlock with the same value. Only the try happens under the lock.
 *   target:  before its memory is freed, whoever finishes it clears every word that
 *            points at it: pc_word_lock, pc_word_unlock with 0. Waiting for the lock
 *            waits out a reader that loaded the pointer and is trying it.
 *   owner:   stores the first value before any other thread can load the word (a plain
 *            store before the object is shared, or pc_word_store to a zero word, which
 *            no reader locks). From then on, only holders of the lock change the word,
 *            except through pc_word_store when no reader can exist (the caller says why).
 *
 * So a reader either locks the word before the target's clear, and its try runs while the
 * memory is certainly alive (succeeding only if the target is not dying), or after it,
 * and sees 0. The lock is for cold paths (navigation, cancellation, a pending target's
 * death): hot paths store the word once and never lock it.
 */
#define PC_WORD_LOCKED 1u

/* The word, lock bit included (acquire: a target seen here was fully initialised). */
uintptr_t pc_word_load(const uintptr_t *_Nonnull word);

/*
 * Stores `value` (lock bit clear) where no thread can hold the lock (release: publishes
 * the target's initialisation to a reader that later loads the value).
 */
void pc_word_store(uintptr_t *_Nonnull word, uintptr_t value);

/*
 * Takes the word's lock, spinning (then yielding) while another thread holds it, and
 * returns the word's value without the lock bit.
 */
uintptr_t pc_word_lock(uintptr_t *_Nonnull word);

/* For the lock's holder: stores `value` (lock bit clear), which releases the lock. */
void pc_word_unlock(uintptr_t *_Nonnull word, uintptr_t value);

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

#endif /* CPROMISECORE_H */
