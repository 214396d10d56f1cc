/*
 * pc_overlay.h: small lock-free helpers the Swift overlay needs besides the promise
 * itself: a countdown and a one-shot election (combinators, `await`), a full fence (cycle
 * detection), an aggregate's retirement gate, and locked words (a reference that never
 * dangles; their lock also guards a promise's waiter list).
 *
 *   function        caller                           progress
 *   pc_count_down   any thread                       wait-free (one fetch-and-sub)
 *   pc_once         any thread                       wait-free (one CAS)
 *   pc_gate_enter   any thread                       wait-free (one fetch-and-add)
 *   pc_gate_leave   any thread, once per enter       lock-free (CAS loop)
 *   pc_fence        any thread                       wait-free (one fence)
 *   pc_context_*    any thread (thread-local)        wait-free, except that the outermost
 *                                                    pc_context_call_end makes the calls queued
 *   pc_slot_*       any thread (thread-local)        wait-free, except that the outermost
 *                                                    pc_slot_run_end runs the slots queued
 *   pc_word_lock    any thread, cold paths only      blocking: a spin lock (then yields) whose
 *                                                    holders run a few instructions
 *   pc_word_publish any thread                       wait-free (one CAS)
 *   pc_word_take    any thread                       lock-free (CAS loop; ends once the word is 0)
 *   pc_word_take_marked                              (the same; or once it is unmarked)
 *   pc_word_load,   any thread (see "locked words")  wait-free (one load or store)
 *   pc_word_store,
 *   pc_word_unlock
 *
 * Synchronisation: pc_count_down, pc_once and pc_fence need none (each is one atomic
 * operation on memory the caller keeps alive). A locked word needs its protocol, below:
 * pc_word_unlock only by the thread whose pc_word_lock returned, and the target's memory
 * freed only after a clear under the lock.
 */
#ifndef PC_OVERLAY_H
#define PC_OVERLAY_H

#include "pc_promise.h"

#ifdef __cplusplus
extern "C" {
#endif

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
 * Task's cancellation. Full (acq_rel): what the winner stored before is visible to whoever
 * later acquires it through pc_count_down.
 */
bool pc_once(uintptr_t *_Nonnull flag);

/*
 * An aggregate's retirement gate: lets a combinator drop what it kept (its settled
 * inputs, its output) once the output has settled, while inputs that are still pending
 * keep firing into it. The word counts the slot callbacks running (PC_GATE_ACTIVE_ONE
 * each) and carries PC_GATE_REQUESTED (someone saw the output settled) and
 * PC_GATE_RETIRED (what was kept has been dropped, or is being dropped).
 *
 * pc_gate_enter returns false once the gate retired: the caller must not touch what
 * the aggregate kept. pc_gate_leave (after every enter, true or false) sets REQUESTED
 * if `request`, and returns true to the one caller that must retire: the one that
 * leaves the gate with no callback running, REQUESTED set, and RETIRED not yet set (it
 * sets RETIRED in the same CAS). So retirement runs once, and never while a callback
 * that entered before it is still running.
 */
#define PC_GATE_REQUESTED 1u
#define PC_GATE_RETIRED 2u
#define PC_GATE_ACTIVE_ONE 4u
bool pc_gate_enter(uintptr_t *_Nonnull gate);
bool pc_gate_leave(uintptr_t *_Nonnull gate, bool request);

/*
 * A full memory fence (StoreLoad included). Cycle detection's Dekker pairing: a promise
 * that starts following another stores its followee link, fences, then reads the links
 * of the promises it would follow; of two promises linking to each other at once, at
 * least one sees the other's link, so no cycle closes unseen.
 */
void pc_fence(void);

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

/*
 * The word, lock bit included. acquire: pairs with the release of pc_word_store /
 * pc_word_unlock that wrote the value, so a target seen here was initialised before it
 * became reachable. Readers that go on to use the target lock first anyway; this load only
 * spares the lock when the word is 0 (or is not the target a clearer looks for). Inline,
 * as pc_state (the compiler's atomic builtin).
 */
static inline uintptr_t pc_word_load(const uintptr_t *_Nonnull word) {
    return __atomic_load_n(word, __ATOMIC_ACQUIRE);
}

/*
 * The word, for one side of a Dekker pairing whose other side stores to this word, then
 * fences (pc_fence), then reads what this side wrote with a full read-modify-write just
 * before this load (a combinator input's publish, then its aggregator's gate). seq_cst,
 * not acquire, for the reason given at pc_holds_after_publish (pc_registry.h): an acquire
 * load may be satisfied before the preceding read-modify-write's store is visible. On x86
 * it is a plain load.
 */
static inline uintptr_t pc_word_load_after_rmw(const uintptr_t *_Nonnull word) {
    return __atomic_load_n(word, __ATOMIC_SEQ_CST);
}

/*
 * Moves a word from 0 to `value` (not 0, lock bit clear) in one CAS; true for the one
 * caller that did. For a target made on first use by whichever thread needs it first
 * (the overlay's rare state): the losers drop theirs and load the winner's. Release:
 * publishes the target's initialisation to a reader that later loads the value.
 */
bool pc_word_publish(uintptr_t *_Nonnull word, uintptr_t value);

/*
 * Stores `value` (lock bit clear) where no thread can hold the lock (release: publishes
 * the target's initialisation to a reader that later loads the value).
 */
void pc_word_store(uintptr_t *_Nonnull word, uintptr_t value);

/*
 * Moves a never-locked word to 0 and returns what it held (0 if it was 0 already): of
 * callers racing for what one store put there, exactly one gets it. For a word handed to
 * work that a context should run once but may run twice (an observer box's source). What
 * the storer wrote before is ordered by the hand-off that lets the takers run (the
 * context's queue), not by this; the CAS is full only so that the take is never moved
 * across the caller's neighbouring accesses to what the value stands for. A word found
 * empty returns 0 after an acquire load.
 */
uintptr_t pc_word_take(uintptr_t *_Nonnull word);

/*
 * pc_word_take, but only a value that has a bit of `mask` set (0, taking nothing, for any
 * other): for a word whose value is sometimes another thread's to take through a
 * hand-off and sometimes anyone's (a parent hold parked for a context's work, which a
 * cancel of the child may take first). Full, as pc_word_take.
 */
uintptr_t pc_word_take_marked(uintptr_t *_Nonnull word, uintptr_t mask);

/*
 * Takes the word's lock, spinning (then yielding) while another thread holds it, and
 * returns the word's value without the lock bit.
 */
uintptr_t pc_word_lock(uintptr_t *_Nonnull word);

/* For the lock's holder: stores `value` (lock bit clear), which releases the lock. */
void pc_word_unlock(uintptr_t *_Nonnull word, uintptr_t value);

/*
 * Calls into an execution context the user gave. A context must run work later, never
 * inside its execute call; one that runs it there anyway (an executor that runs work at
 * once when called on its own thread, say) would nest each handler's settle inside the
 * one before, and a long chain of such handlers would overflow the stack. So the overlay
 * brackets each such call with pc_context_call_begin and pc_context_call_end, and first
 * asks pc_context_calls_too_deep: true when this thread is inside PC_CONTEXT_NESTING of
 * those calls already. Then it does not make the call but queues it
 * (pc_context_run_later), and the outermost pc_context_call_end makes the queued calls,
 * in order, on this thread, one deep (what they nest nests again from there).
 * Thread-local: no atomics, no lock. The queue's buffer (malloc) goes when the queue is
 * run.
 */
#define PC_CONTEXT_NESTING 16u

#if defined(__GNUC__) || defined(__clang__)
extern __thread unsigned pc_context_call_depth; /* C and C++ alike: no TLS wrapper function */
#else
extern _Thread_local unsigned pc_context_call_depth;
#endif

static inline void pc_context_call_begin(void) {
    pc_context_call_depth += 1;
}

void pc_context_call_end(void);

static inline bool pc_context_calls_too_deep(void) {
    return pc_context_call_depth >= PC_CONTEXT_NESTING;
}

/* Queues run(item) for the outermost pc_context_call_end on this thread (only while
 * pc_context_calls_too_deep). Aborts if out of memory. */
void pc_context_run_later(void *_Nonnull item, pc_run_fn _Nonnull run);

/*
 * Combinator slots (the overlay's aggregators). A slot runs its combinator's policy inside
 * the firing of the input that settled, so that the output has settled before that
 * input's settling call returns (the first input to settle decides a race, on any
 * thread). Combinators nested directly, each output the input of the next, then settle
 * one inside the other, a few frames deeper per level. So the overlay brackets each run
 * with pc_slot_run_begin and pc_slot_run_end, and first asks pc_slot_runs_too_deep: true
 * when this thread is inside PC_SLOT_NESTING runs already. Then the slot does not run
 * but is queued (pc_slot_run_later), and the outermost pc_slot_run_end runs the queued
 * slots, in order, one deep (what they nest nests again from there), before it returns:
 * still inside the first input's firing, so a nesting of any depth settles, in bounded
 * stack, before that input's settling call returns. The levels past the limit settle
 * once the levels below have fired all their observers, not inside their firing: hence a
 * limit far past what code nests (a level costs about 1 KiB of stack in a debug build,
 * 1.4 KiB under ThreadSanitizer: 128 levels fit a 512 KiB thread stack with room to
 * spare). Thread-local: no atomics, no lock, no allocation (the queue links the slots'
 * own nodes, which no list holds then).
 */
#define PC_SLOT_NESTING 128u

#if defined(__GNUC__) || defined(__clang__)
extern __thread unsigned pc_slot_run_depth;
#else
extern _Thread_local unsigned pc_slot_run_depth;
#endif

static inline bool pc_slot_runs_too_deep(void) {
    return pc_slot_run_depth >= PC_SLOT_NESTING;
}

static inline void pc_slot_run_begin(void) {
    pc_slot_run_depth += 1;
}

void pc_slot_run_end(void);

/* Queues node->fire(node, NULL) for the outermost pc_slot_run_end on this thread (only
 * while pc_slot_runs_too_deep). The node must be in no list; its next is the queue's. */
void pc_slot_run_later(pc_node *_Nonnull node);

/*
 * The word of the application's diagnostics handler (the overlay's PromiseDiagnostics): a
 * locked word, as above, holding the overlay's retained handler box, or 0 when none is
 * set. Read (pc_word_load) only where something is reported: a rejected promise's death,
 * a broken promise, a cycle; never on the register, settle or fire paths.
 */
uintptr_t *_Nonnull pc_diagnostics_word(void);

/*
 * What the overlay found of the runtimes below the language (its RuntimeBridge), two
 * answers of two bits each: at PC_RUNTIME_COUNT_WORD, the Swift runtime's reference count
 * word (`RefCountWord.layoutAsExpected`); at PC_RUNTIME_DISPATCH_QUEUE, where a
 * `DispatchQueue` keeps the Dispatch queue it wraps
 * (`DispatchBridge.queueLayoutAsExpected`). Each is PC_RUNTIME_LAYOUT_UNKNOWN until a
 * thread checked, then _EXPECTED or _OTHER, for good.
 * Read on every unowned hold the overlay takes or drops and every handler it sends to a
 * queue, so a plain word read inline, not a lazy Swift global (whose accessor calls
 * swift_once on every read on Linux). Relaxed both ways: an answer depends on the
 * runtimes alone, so a thread that reads UNKNOWN checks for itself and finds the same.
 */
#define PC_RUNTIME_LAYOUT_UNKNOWN 0u
#define PC_RUNTIME_LAYOUT_EXPECTED 1u
#define PC_RUNTIME_LAYOUT_OTHER 2u
#define PC_RUNTIME_COUNT_WORD 0u
#define PC_RUNTIME_DISPATCH_QUEUE 2u
#if defined(__clang__)
__attribute__((swift_private))
#endif
extern uintptr_t pc_runtime_layout_word;

static inline uintptr_t pc_runtime_layout(uintptr_t which) {
    return (__atomic_load_n(&pc_runtime_layout_word, __ATOMIC_RELAXED) >> which) & 3u;
}

static inline void pc_runtime_layout_set(uintptr_t which, uintptr_t layout) {
    /* An OR, relaxed: the other answer, which another thread may be recording at the same
       time, stays; the same answer recorded twice is the same bits. */
    AO_or((volatile AO_t *)&pc_runtime_layout_word, (AO_t)(layout << which));
}

#ifdef __cplusplus
}
#endif

#endif /* PC_OVERLAY_H */
