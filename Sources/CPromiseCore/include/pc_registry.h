/*
 * pc_registry.h: what a promise's tree needs after it settled, so that a cancel still
 * reaches what is in flight below it: the cancellation registry (`children`), the tree
 * flags (`tree_flags`: linked, a cancel being forwarded, the first-observer slot taken,
 * an early settle's link walk done),
 * the holds that keep the path of an in-flight descendant alive (`holds`, in the
 * pc_lineage only a derived promise has), and the process-wide forwarding epoch.
 *
 *   function              caller                    progress
 *   pc_children_push      any thread, any time      lock-free (CAS loop)
 *   pc_children_take      any thread, any time      lock-free (CAS loop)
 *   pc_children_forget    any thread                wait-free (one fetch-and-add)
 *   pc_tree_flags_set     any thread, any time      lock-free (CAS loop; ends once the bit is set)
 *   pc_tree_flags_update  any thread, any time      lock-free (CAS loop)
 *   pc_tree_flags         any thread, any time      wait-free (one load); _after_fence
 *                                                   waits out a retirement being decided
 *                                                   (a few instructions on another thread)
 *   pc_holds_*            any thread, any time      lock-free (CAS loops) or wait-free (fetch-and-add)
 *   pc_forwarding_*       any thread                wait-free (one load or fetch-and-add)
 *
 * None of them needs external synchronisation against another or against the state
 * machine's calls, except that the promise must be alive (its memory held) for all of
 * them, for pc_holds_* the derived promise that embeds the pc_lineage: the registry is
 * taken whole and pushed back, never unlinked node by node.
 */
#ifndef PC_REGISTRY_H
#define PC_REGISTRY_H

#include "pc_promise.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The cancellation registry: links to descendants that are still in flight after this
 * promise settled (handlers queued on a context, children following another promise),
 * so that a later cancel can reach them. A Treiber stack that, unlike the observer
 * stack, outlives settling. Push is lock-free; take removes the whole stack at once, so
 * nodes are never unlinked one by one (no ABA). Returns the number of links pushed so far
 * (approximate under races; used only to decide when to prune).
 */
uintptr_t pc_children_push(pc_promise *_Nonnull promise, pc_link *_Nonnull link);

/* Takes the whole registry (newest first, NULL if empty); the caller owns the nodes. */
pc_link *_Nullable pc_children_take(pc_promise *_Nonnull promise);

/*
 * Whether the registry is empty, for the owner's deinit only: nobody else reaches a
 * dying promise (a push or a take needs a reference to it), and the release that ended
 * its life ordered every earlier push before the deinit. No ordering, inline: most
 * promises die with an empty registry, and skip pc_children_take's call.
 */
static inline bool pc_children_empty_at_deinit(const pc_promise *_Nonnull promise) {
    return __atomic_load_n(&promise->children, __ATOMIC_RELAXED) == 0;
}

/* Lowers the registry's count after the caller dropped `count` links it had taken. */
void pc_children_forget(pc_promise *_Nonnull promise, uintptr_t count);

/* Bits of the `tree_flags` word. */
#define PC_TREE_LINKED 1u           /* linked into the parent's registry */
#define PC_TREE_CANCEL_CLAIMED 2u   /* a cancel of the settled promise is being forwarded */
#define PC_TREE_CANCEL_PUBLISHED 4u /* ...and its reason is stored: descendants that show up
                                         in the registry later must be cancelled too */
#define PC_TREE_FIRST_OBSERVER 8u   /* a root's node is taken (never cleared) */
#define PC_TREE_ADOPTED 8u          /* the same bit on a derived promise, which has no first
                                       observer: it took the outcome of the promise it
                                       follows (the overlay's retirement counts the hold it
                                       took before, which nothing but its publisher drops) */
#define PC_TREE_ERROR_SEEN 16u      /* an observer read this rejected promise's error (the
                                       overlay's diagnostics: an unhandled rejection is one
                                       freed without it) */
#define PC_TREE_LEFT_PARENT 32u     /* a derived promise settled early (not by its handler)
                                       linked itself up its chain while its parent was
                                       pending: its node there may now leave (the overlay's
                                       prune) */
#define PC_TREE_RETIRED 64u         /* only a cascade's keep (pc_keep_until_cascade_end) still
                                       held this settled promise, so the overlay freed its
                                       value early; a reader that reached it through a link
                                       that does not hold it treats it as gone. Final: set
                                       once, never cleared */
#define PC_TREE_RETIRING 128u       /* the overlay is deciding whether to retire: set before
                                       its second look at the reference counts, then turned
                                       into RETIRED or cleared (pc_tree_flags_update); a
                                       reader waits it out (pc_tree_flags_after_fence) */
#define PC_TREE_WALKED_THROUGH 256u /* a cycle check's walk went on through this pending
                                       child to its parent, and may have recorded a skip
                                       over it that holds while it waits on its parent: if
                                       it locks in to follow another promise instead, it
                                       advances the walk epoch (pc_walk_epoch_advance) */
#define PC_TREE_COUNT_SHIFT 9u      /* the registry's link count sits above the nine bits */

/*
 * Sets `bit` in the tree_flags word; true for the one call that set it, with a full
 * (acq_rel, see pc_promise.h) CAS: a canceller's PUBLISHED store publishes the reason
 * stored before it, and is ordered before its pc_children_take. A link pushed
 * concurrently is either taken by the canceller or sees PUBLISHED, because
 * pc_children_push ends with a read-modify-write of this same word: the two are ordered
 * in the word's modification order, and each reads what the other wrote before it. A
 * call that finds the bit set already returns false after an acquire load (it stored
 * nothing; its later loads come after the bit).
 */
bool pc_tree_flags_set(pc_promise *_Nonnull promise, uintptr_t bit);

/* Clears the bits of `clear` and sets those of `set` in one CAS, full (acq_rel). For the
 * retirement's decision: PC_TREE_RETIRING becomes PC_TREE_RETIRED, or goes. */
void pc_tree_flags_update(pc_promise *_Nonnull promise, uintptr_t clear, uintptr_t set);

/* The tree_flags word. acquire: pairs with the full CAS in pc_tree_flags_set; a
 * PUBLISHED bit seen here makes the reason stored before it visible. Inline, as
 * pc_state. */
static inline uintptr_t pc_tree_flags(const pc_promise *_Nonnull promise) {
    return __atomic_load_n(&promise->tree_flags, __ATOMIC_ACQUIRE);
}

/*
 * The tree_flags word, after a full fence, with no PC_TREE_RETIRING in it: for a reader
 * that has just taken a strong reference with a relaxed read-modify-write on another word
 * (the Swift runtime's try-retain) and must then know whether the promise was retired.
 * Dekker with the overlay's retirement, which sets RETIRING (pc_tree_flags_set, full),
 * fences and reads the reference counts again: either it sees this reader's reference
 * and keeps the value (RETIRING goes), or this load sees RETIRING. Seen, RETIRING is
 * waited out (spinning, then yielding): the decision it stands for is a few instructions
 * on the retiring thread, and it may go either way, so only its outcome answers. The
 * fence is needed on weakly ordered machines: an acquire load may be satisfied before a
 * relaxed read-modify-write's store is visible.
 */
uintptr_t pc_tree_flags_after_fence(const pc_promise *_Nonnull promise);

/*
 * The holds word: what keeps a settled promise's parent alive while a descendant is still
 * in flight, so that a cancel from above can still reach that descendant through the
 * registries on its path. The overlay decides what a hold is (a strong reference to the
 * parent, taken on the first hold and dropped with the last); this word only counts:
 * PC_HOLDS_SELF is the promise's own hold while it is in flight itself (set once, cleared
 * once by pc_holds_clear_self), each PC_HOLDS_ONE a descendant's, and PC_HOLDS_GONE says
 * the parent was found dead, so there is nothing to hold any more. Every operation that
 * changes the word is a full read-modify-write (seq_cst for pc_holds_add and
 * pc_holds_remove_one, acq_rel for the CASes: see pc_promise.h): a promise that sets SELF
 * and then reads its state pairs with the publisher that CASes the state and then reads
 * this word (Dekker: one of them sees the other), each reading with a seq_cst load
 * (pc_state_after_hold, pc_holds_after_publish). One that finds nothing to change
 * (nothing held, SELF clear, GONE set already) returns after an acquire load of the word.
 */
#define PC_HOLDS_SELF 1u
#define PC_HOLDS_GONE 2u
#define PC_HOLDS_ONE 4u

/* Adds `delta` only if the word already holds something; true if it did (no transition). */
bool pc_holds_add_if_holding(pc_lineage *_Nonnull lineage, uintptr_t delta);

/* Adds `delta` (PC_HOLDS_SELF or PC_HOLDS_ONE) and returns the word before. */
uintptr_t pc_holds_add(pc_lineage *_Nonnull lineage, uintptr_t delta);

/* Removes one PC_HOLDS_ONE and returns the word before. Aborts on underflow. */
uintptr_t pc_holds_remove_one(pc_lineage *_Nonnull lineage);

/* Clears PC_HOLDS_SELF if it is set and returns the word before (SELF set in it: this
 * call cleared it). */
uintptr_t pc_holds_clear_self(pc_lineage *_Nonnull lineage);

/* Sets PC_HOLDS_GONE (the parent was found dead: it stays dead). */
void pc_holds_mark_gone(pc_lineage *_Nonnull lineage);

/* The holds word. acquire: pairs with the full read-modify-writes of pc_holds_add and
 * pc_holds_clear_self, so the caller's decision to clear SELF follows what the word
 * showed. Inline, as pc_state. */
static inline uintptr_t pc_holds(const pc_lineage *_Nonnull lineage) {
    return __atomic_load_n(&lineage->holds, __ATOMIC_ACQUIRE);
}

/*
 * The two loads of the Dekker pairing between a promise going in flight and its publisher:
 * the in-flight side adds PC_HOLDS_SELF (pc_holds_add, full), then loads the state; the
 * publisher publishes (pc_publish's full CAS), then loads the holds word. At least one of
 * them must see the other's write, or neither drops SELF and the path stays held.
 *
 * seq_cst, not acquire: on ARMv8.3 and later (Apple silicon) an acquire load may compile
 * to LDAPR, which may be satisfied before the release store of the preceding atomic
 * read-modify-write is visible (libatomic_ops' generic _full CAS is acq_rel); a seq_cst
 * load (LDAR) may not. On x86 both are a plain load after a locked instruction. (What this
 * rests on, beyond C11, is in pc_promise.h: "Memory orderings".)
 */
static inline uintptr_t pc_holds_after_publish(const pc_lineage *_Nonnull lineage) {
    return __atomic_load_n(&lineage->holds, __ATOMIC_SEQ_CST);
}

static inline uintptr_t pc_state_after_hold(const pc_promise *_Nonnull promise) {
    return __atomic_load_n(&promise->state, __ATOMIC_SEQ_CST) & PC_OUTCOME_MASK;
}

/*
 * Whether PC_HOLDS_SELF is set, as a hint. Relaxed, and inline: the publisher of every
 * promise that may hold asks before it publishes, to watch what its publish fires; it
 * reads pc_holds after pc_publish in any case (the Dekker pairing with pc_holds_add), and
 * treats a SELF it did not expect as one to keep (the overlay's publishClaimedOutcome).
 */
static inline bool pc_holds_self_hint(const pc_lineage *_Nonnull lineage) {
    return (__atomic_load_n(&lineage->holds, __ATOMIC_RELAXED) & PC_HOLDS_SELF) != 0;
}

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
#if UINTPTR_MAX > 0xFFFFFFFFu
#define PC_FORWARDING_ACTIVE_MASK 0xFFFFFu /* forwards in progress (up to about a million) */
#define PC_FORWARDING_EPOCH_ONE 0x100000u  /* 44 bits of epoch */
#else
#define PC_FORWARDING_ACTIVE_MASK 0xFFFu   /* forwards in progress (up to 4,095) */
#define PC_FORWARDING_EPOCH_ONE 0x1000u    /* 20 bits of epoch */
#endif

/*
 * The epoch never wraps: a parent's recorded value seen again after a wrap would vouch
 * for ancestors cancelled meanwhile. The end that brings it to its largest value (all
 * epoch bits set: after 2^44 forwards on 64-bit targets, about a million on 32-bit ones)
 * leaves its count of one in progress in place for good, so the word is never quiet
 * again and every handler's claim from then on looks at its ancestors: slower, but exact.
 * Readers pay nothing for it: quiet is still "no forward in progress".
 */
static inline bool pc_forwarding_is_quiet(uintptr_t word) {
    return (word & PC_FORWARDING_ACTIVE_MASK) == 0;
}

/* Before a forwarded cancel sets PC_TREE_CANCEL_PUBLISHED. Full (seq_cst). */
void pc_forwarding_begin(void);

/* After that bit is set. Full (acq_rel): a reader that sees the new word sees the bit. */
void pc_forwarding_end(void);

/* The word itself: only pc_forwarding_* touch it (Swift sees it as a private name). */
#if defined(__clang__)
__attribute__((swift_private))
#endif
extern uintptr_t pc_forwarding_word;

/*
 * The word; call after the claim CAS. acquire: pairs with the release half of
 * pc_forwarding_end, so the PUBLISHED bits of every forward that ended before the value
 * read are visible to the caller's following pc_tree_flags loads. Nothing orders it
 * before the caller's claim CAS becomes visible (that CAS is acq_rel), and nothing needs
 * to: a value from before a concurrent forward's begin only lets the claim win the race
 * with that cancel, as if it had come first. Inline: every handler's claim reads it.
 */
static inline uintptr_t pc_forwarding_epoch(void) {
    return __atomic_load_n(&pc_forwarding_word, __ATOMIC_ACQUIRE);
}

/*
 * The walk epoch: one process-wide count of the lock-ins of pending children that a cycle
 * check's walk went through to their parent (PC_TREE_WALKED_THROUGH). The overlay's walk
 * records, at a follower, where its chain of waits ends, to skip there later; a record
 * that passes through such a child holds only while the child waits on its parent, so it
 * carries the epoch it was made in, and holds while the epoch has not moved. Written only
 * by those lock-ins (rare); read by walks (cold).
 */
#if defined(__clang__)
__attribute__((swift_private))
#endif
extern uintptr_t pc_walk_epoch_word;

/*
 * The epoch. acquire: pairs with the full read-modify-write of pc_walk_epoch_advance. A
 * walk reads it once, as it begins (after the full fence that follows the store of the
 * link it checks), and takes only the skips recorded in that epoch.
 */
static inline uintptr_t pc_walk_epoch(void) {
    return __atomic_load_n(&pc_walk_epoch_word, __ATOMIC_ACQUIRE);
}

/*
 * Advances the epoch: called by a child marked PC_TREE_WALKED_THROUGH once its claim to
 * follow won and its followee link is recorded. Full (seq_cst), in two Dekker pairings,
 * each with a pc_fence on both sides. The child's claim CAS and link, pc_fence, then its
 * load of the mark, against a walk's mark (pc_tree_flags_set), pc_fence, then its load
 * of the claim: either the walk sees the child locked in (and does not go through it),
 * or the child sees the mark and advances. This increment, pc_fence, then the child's
 * loads of links in its own cycle check, against a walk's store of the link it checks,
 * pc_fence, then its pc_walk_epoch load: either that walk reads the new epoch (and takes
 * no skip recorded through the child), or the child's check sees the walk's link (and
 * finds a cycle closed through both).
 */
void pc_walk_epoch_advance(void);

#ifdef __cplusplus
}
#endif

#endif /* PC_REGISTRY_H */
