/*
 * CPromiseCore: see include/CPromiseCore.h for the state machine, the thread table and
 * the progress guarantees. Every atomic operation below says what its ordering
 * publishes or acquires, and which operation it pairs with.
 */
#define _POSIX_C_SOURCE 200809L /* sched_yield under -std=c11 */

#include "CPromiseCore.h"

#include <atomic_ops.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(AO_t) == sizeof(uintptr_t), "AO_t must be a machine word");
_Static_assert(_Alignof(pc_node) >= 8, "nodes must leave three tag bits free");
_Static_assert(_Alignof(pc_promise) >= 4, "the cascade watch word uses two low bits of an address");
_Static_assert(offsetof(pc_promise, state) == 0, "state word first");
/* Ten words, on 64-bit and 32-bit targets alike (make test-core-32 builds it so). A
 * derived promise adds its four-word pc_lineage. */
_Static_assert(sizeof(pc_promise) == 10 * sizeof(void *), "pc_promise is ten words");
_Static_assert(sizeof(pc_lineage) == 4 * sizeof(void *), "pc_lineage is four words");

/* A guaranteed tail call where the compiler offers one (clang; gcc 15), a plain one
 * elsewhere. */
#if defined(__has_attribute)
#if __has_attribute(musttail)
#define PC_MUSTTAIL __attribute__((musttail))
#endif
#endif
#ifndef PC_MUSTTAIL
#define PC_MUSTTAIL
#endif

/* Failed lock attempts before each further one yields the processor: a holder that was
 * preempted then gets it back (the stress tests run more threads than cores). */
#define PC_SPINS_BEFORE_YIELD 64u

/* libatomic_ops operates on AO_t; our words are uintptr_t of the same size. */
#define PC_WORD(p) ((volatile AO_t *)(p))

/* Impossible states fail loudly, naming the function and the word it saw. */
static void pc_die(const char *function, const char *what, uintptr_t word) {
    fprintf(stderr, "CPromiseCore: %s: %s (word 0x%lx)\n", function, what, (unsigned long)word);
    abort();
}

/* ---- the per-thread trampoline -------------------------------------------------- */

/*
 * Thread-local FIFO of deferred nodes, and the references kept until the cascade ends.
 * `depth` counts the pc_publish / pc_observe / pc_inline_begin scopes active on this
 * thread; the one that brings it back to zero drains both. pc_scope_opener_word (inline
 * in pc_promise.h) is the promise whose pc_publish or pc_observe opened the outermost
 * scope (0 for pc_inline_begin's). Only this thread
 * touches them: no atomics.
 */
enum {
    PC_KEPT_RETAINED = 1024, /* the largest buffer a thread keeps between cascades */
};

/* The trampoline itself (its type in pc_promise.h, whose inline pc_defer and
 * pc_keep_until_cascade_end push onto it). */
#if defined(__GNUC__) || defined(__clang__)
__thread pc_trampoline_state pc_trampoline;
#else
_Thread_local pc_trampoline_state pc_trampoline;
#endif

/* A thread's heap buffer of kept references outlives its cascades (up to
 * PC_KEPT_RETAINED entries); this key's destructor frees it when the thread exits. */
static pthread_key_t pc_kept_key;
static pthread_once_t pc_kept_key_once = PTHREAD_ONCE_INIT;

/* The key's destructor, on the exiting thread, whose thread-local block is still there:
 * the trampoline forgets the buffer before it goes, so that a cascade run by a later
 * destructor (of a key created after ours: an object in thread-local storage whose deinit
 * settles a promise) starts again from the inline buffer instead of writing into freed
 * memory. A buffer it grows again is set on the key again, and the destructor runs again. */
static void pc_kept_free(void *buffer) {
    if (pc_trampoline.kept == buffer) {
        pc_trampoline.kept = NULL;
        pc_trampoline.kept_capacity = 0;
    }
    free(buffer);
}

static void pc_kept_key_create(void) {
    if (pthread_key_create(&pc_kept_key, pc_kept_free) != 0) {
        pc_die("pc_keep_until_cascade_end", "pthread_key_create failed", 0);
    }
}

/* The cascade watch and the scope's opener (inline in pc_promise.h): thread-local, no
 * atomics. */
#if defined(__GNUC__) || defined(__clang__)
__thread uintptr_t pc_cascade_watch_word;
__thread uintptr_t pc_scope_opener_word;
#else
_Thread_local uintptr_t pc_cascade_watch_word;
_Thread_local uintptr_t pc_scope_opener_word;
#endif

/* A FIFO of nodes linked through their own next fields, none in any other list meanwhile:
 * the trampoline's and the combinator slots' queue (thread-local both). */
static inline void pc_fifo_push(pc_node **head, pc_node **tail, pc_node *node) {
    node->next = NULL;
    if (*tail != NULL) {
        (*tail)->next = node;
    } else {
        *head = node;
    }
    *tail = node;
}

/* The oldest node, or NULL; its next is read here, before the caller fires it (a fire may
 * free the node). */
static inline pc_node *pc_fifo_pop(pc_node **head, pc_node **tail) {
    pc_node *node = *head;
    if (node != NULL) {
        *head = node->next;
        if (*head == NULL) {
            *tail = NULL;
        }
    }
    return node;
}

static void pc_drain(void) {
    pc_trampoline.depth = 1; /* a fire callback that publishes or observes only queues */
    for (;;) {
        pc_node *node = pc_fifo_pop(&pc_trampoline.head, &pc_trampoline.tail);
        if (node != NULL) {
            node->fire(node, NULL);
        } else if (pc_trampoline.kept_count != 0) {
            /* Newest first; a release may defer more work, which runs before the next. */
            pc_kept kept = pc_trampoline.kept[--pc_trampoline.kept_count];
            kept.release(kept.item);
        } else {
            break;
        }
    }
    /* A very long cascade's buffer goes with it: an idle thread keeps at most 16 KiB. */
    if (pc_trampoline.kept_capacity > PC_KEPT_RETAINED) {
        free(pc_trampoline.kept);
        pc_trampoline.kept = NULL;
        pc_trampoline.kept_capacity = 0;
        (void)pthread_setspecific(pc_kept_key, NULL); /* created with the buffer just freed */
    }
    pc_trampoline.depth = 0; /* the opener, if any, is cleared by pc_scope_leave */
}

/* Opens a scope for a call on `promise` (which its caller holds until the call returns). */
static inline void pc_scope_enter(const pc_promise *promise) {
    if (pc_trampoline.depth == 0) {
        pc_scope_opener_word = (uintptr_t)promise;
    }
    pc_trampoline.depth += 1;
}

static inline void pc_scope_leave(void) {
    pc_trampoline.depth -= 1;
    if (pc_trampoline.depth == 0) {
        if (pc_trampoline.head != NULL || pc_trampoline.kept_count != 0) {
            pc_drain();
        }
        pc_scope_opener_word = 0;
    }
}

void pc_defer_outside_scope(pc_node *node) {
    if (node->fire == NULL) {
        pc_die("pc_defer", "node has no fire callback", (uintptr_t)node);
    }
    pc_fifo_push(&pc_trampoline.head, &pc_trampoline.tail, node);
    if (pc_trampoline.depth == 0) {
        pc_drain();
    }
}

/* pc_keep_until_cascade_end when the buffer is full: the inline buffer first, then a heap
 * buffer doubling each time. Out of line, so that the common path stays a few
 * instructions (it needs no registers saved across a call). */
bool pc_keep_growing(void *item, pc_release_fn release) {
    if (pc_trampoline.kept == NULL) {
        pc_trampoline.kept = pc_trampoline.kept_inline;
        pc_trampoline.kept_capacity = PC_KEPT_INLINE;
    } else {
        size_t capacity = pc_trampoline.kept_capacity;
        pc_kept *grown = malloc(2 * capacity * sizeof *grown);
        if (grown == NULL) {
            pc_die("pc_keep_until_cascade_end", "out of memory", (uintptr_t)capacity);
        }
        memcpy(grown, pc_trampoline.kept, capacity * sizeof *grown);
        if (pc_trampoline.kept != pc_trampoline.kept_inline) {
            free(pc_trampoline.kept);
        }
        pc_trampoline.kept = grown;
        pc_trampoline.kept_capacity = 2 * capacity;
        (void)pthread_once(&pc_kept_key_once, pc_kept_key_create);
        (void)pthread_setspecific(pc_kept_key, grown);
    }
    pc_trampoline.kept[pc_trampoline.kept_count++] = (pc_kept){release, item};
    return true;
}

bool pc_cascade_keeps_last(const void *item, pc_release_fn release) {
    size_t count = pc_trampoline.kept_count; /* thread-local: no other thread touches it */
    if (pc_trampoline.depth == 0 || count == 0) {
        return false;
    }
    pc_kept last = pc_trampoline.kept[count - 1];
    return last.item == item && last.release == release;
}

uintptr_t pc_inline_begin(const pc_promise *promise) {
    /* acquire: pairs with the release half of the publishing CAS in pc_publish, as the
     * load in pc_observe does; a quiescent outcome seen here makes its value visible.
     * (First: most observers register on pending promises, and this load is cheaper than
     * the thread-local lookup.) */
    uintptr_t seen = (uintptr_t)AO_load_acquire(PC_WORD(&promise->state));
    uintptr_t tags = seen & PC_TAG_MASK;
    if ((tags & PC_OUTCOME_MASK) == PC_PENDING || (tags & PC_STATE_FIRING) != 0) {
        return PC_PENDING; /* pending, or earlier observers still firing: register */
    }
    if (pc_trampoline.depth != 0) {
        return PC_PENDING; /* inside a firing: the observer must queue behind it */
    }
    /* The outermost scope, with no opener recorded (see pc_scope_opened_by): the caller
     * runs its observer itself, with no node to lend the promise to, and the nested
     * registration on it that would borrow it is rare. Two thread-local stores fewer on
     * the path of every observer of a settled promise. */
    pc_trampoline.depth = 1;
    return tags & PC_OUTCOME_MASK;
}

void pc_inline_end(void) {
    /* The scope pc_inline_begin opened, back at the outermost level; the opener word is
     * still 0, as nested scopes record none. */
    if (pc_trampoline.head != NULL || pc_trampoline.kept_count != 0) {
        pc_drain(); /* leaves depth at 0 */
    } else {
        pc_trampoline.depth = 0;
    }
}

/* ---- registration ---------------------------------------------------------------- */

void pc_observe_slow(pc_promise *promise, pc_node *node) {
    if (((uintptr_t)node & PC_TAG_MASK) != 0 || node->fire == NULL) {
        pc_die("pc_observe", "misaligned node or no fire callback", (uintptr_t)node);
    }
    /* acquire: if this load sees a quiescent outcome, the outcome value stored before the
     * publishing CAS in pc_publish is visible to the fire callback below. */
    uintptr_t seen = (uintptr_t)AO_load_acquire(PC_WORD(&promise->state));
    for (;;) {
        uintptr_t tags = seen & PC_TAG_MASK;
        if ((tags & PC_OUTCOME_MASK) != PC_PENDING && (tags & PC_STATE_FIRING) == 0) {
            break; /* settled and quiescent: fire it ourselves, below */
        }
        node->next = (pc_node *)(seen & ~PC_TAG_MASK);
        /* release: publishes node->next, node->fire and every field of the object that
         * embeds the node before the node becomes reachable from the word; pairs with
         * the acquire half of the taking CAS in pc_publish (and the load in pc_detach). */
        uintptr_t was = (uintptr_t)AO_fetch_compare_and_swap_release(
            PC_WORD(&promise->state), (AO_t)seen, (AO_t)((uintptr_t)node | tags));
        if (was == seen) {
            return;
        }
        /* acquire: the failed CAS read the word without ordering; reload it so that a
         * settled tag seen here also makes the outcome value visible. */
        seen = (uintptr_t)AO_load_acquire(PC_WORD(&promise->state));
    }
    pc_scope_enter(promise);
    node->fire(node, promise);
    pc_scope_leave();
}

/* ---- settling -------------------------------------------------------------------- */

static void pc_fire_in_order(pc_node *stack, pc_promise *source) {
    pc_node *ordered = NULL; /* reverse: the stack is newest first */
    while (stack != NULL) {
        pc_node *next = stack->next;
        stack->next = ordered;
        ordered = stack;
        stack = next;
    }
    while (ordered != NULL) {
        pc_node *next = ordered->next; /* read before fire: fire hands the node back */
        ordered->fire(ordered, source);
        ordered = next;
    }
}

/*
 * Waits while a pruner holds the observer stack (the word is PENDING|PC_STATE_FIRING: see
 * pc_prune) and returns the word it then reads. The pruner's hold lasts one walk of the
 * nodes it took, deciding which gave up, and one CAS putting the rest back; it releases
 * what it dropped only after that. Spins, then yields, as a locked word's reader does.
 */
static uintptr_t pc_wait_for_pruner(const pc_promise *promise) {
    unsigned spins = 0;
    for (;;) {
        /* acquire: pairs with the pruner's full put-back CAS, so the relinked `next`
         * fields are visible before we take the stack. */
        uintptr_t seen = (uintptr_t)AO_load_acquire(PC_WORD(&promise->state));
        if ((seen & PC_TAG_MASK) != PC_STATE_FIRING) {
            return seen;
        }
        if (++spins >= PC_SPINS_BEFORE_YIELD) {
            sched_yield();
        }
    }
}

void pc_publish(pc_promise *promise) {
    /* No ordering: this thread won the claim CAS itself, so it reads its own write. */
    uintptr_t outcome = (uintptr_t)AO_load(PC_WORD(&promise->claim));
    if (outcome < PC_FULFILLED || outcome > PC_CANCELLED) {
        pc_die("pc_publish", "claim holds no outcome", outcome);
    }
    pc_scope_enter(promise);
    /* No ordering: only a first guess for the CAS below, which validates it. */
    uintptr_t seen = (uintptr_t)AO_load(PC_WORD(&promise->state));
    if ((seen & PC_OUTCOME_MASK) != PC_PENDING) {
        pc_die("pc_publish", "published twice", seen);
    }
    if ((seen & PC_TAG_MASK) == PC_STATE_FIRING) {
        /* A pruner holds the older nodes: they must fire first, and on this thread. */
        seen = pc_wait_for_pruner(promise);
    }
    for (;;) {
        pc_node *stack = (pc_node *)(seen & ~PC_TAG_MASK);
        /* While a batch fires, keep PC_STATE_FIRING so later registrations queue behind it. */
        uintptr_t next = (stack != NULL) ? (outcome | PC_STATE_FIRING) : outcome;
        /* full (acquire + release): release publishes the outcome value stored before
         * this call to every thread whose acquire load later sees the tag (pc_state,
         * pc_observe); acquire pairs with the release push in pc_observe (and the
         * put-back in pc_prune), so the nodes taken and the objects embedding them are
         * fully visible before they fire. */
        uintptr_t was = (uintptr_t)AO_fetch_compare_and_swap_full(
            PC_WORD(&promise->state), (AO_t)seen, (AO_t)next);
        if (was != seen) {
            /* Only a pending word can show a prune: none starts once the outcome is in. */
            seen = (was & PC_TAG_MASK) == PC_STATE_FIRING ? pc_wait_for_pruner(promise) : was;
            continue;
        }
        if (stack == NULL) {
            break; /* quiescent: late registrations now fire themselves */
        }
        pc_fire_in_order(stack, promise);
        seen = next; /* the CAS above tells us if registrations arrived meanwhile */
    }
    pc_scope_leave();
}

bool pc_prune(pc_promise *promise, pc_prune_test_fn gave_up, pc_prune_release_fn release,
              void *context, size_t *kept_count) {
    /* No ordering: a first guess for the CAS, which validates it. */
    uintptr_t seen = (uintptr_t)AO_load(PC_WORD(&promise->state));
    for (;;) {
        if ((seen & PC_TAG_MASK) != PC_PENDING) {
            return false; /* settled, firing, or another prune has the stack */
        }
        if (seen == PC_PENDING) {
            *kept_count = 0;
            return true; /* nothing registered: nothing to prune */
        }
        /* full: acquire pairs with the release pushes in pc_observe, so the nodes taken
         * (and the objects embedding them, which `gave_up` reads) are visible; the word
         * becomes PENDING|FIRING, "a pruner holds the stack", with no nodes. */
        uintptr_t was = (uintptr_t)AO_fetch_compare_and_swap_full(
            PC_WORD(&promise->state), (AO_t)seen, (AO_t)PC_STATE_FIRING);
        if (was == seen) {
            break;
        }
        seen = was;
    }
    /* Split, keeping the order (newest first, as taken): the kept nodes go back, the
     * dropped ones are released once the stack is back (a publisher waits meanwhile). */
    pc_node *kept = NULL, *dropped = NULL;
    pc_node **kept_link = &kept;
    size_t count = 0;
    for (pc_node *node = (pc_node *)(seen & ~PC_TAG_MASK); node != NULL;) {
        pc_node *next = node->next;
        if (gave_up(node, context)) {
            node->next = dropped;
            dropped = node;
        } else {
            *kept_link = node;
            kept_link = &node->next;
            count += 1;
        }
        node = next;
    }
    *kept_link = NULL;
    /* Put the kept nodes back below those registered meanwhile (newer, so nearer the
     * head). acquire: pairs with the release pushes in pc_observe, so the `next` fields of
     * the nodes pushed meanwhile, which we walk, are visible. */
    seen = (uintptr_t)AO_load_acquire(PC_WORD(&promise->state));
    for (;;) {
        if ((seen & PC_TAG_MASK) != PC_STATE_FIRING) {
            pc_die("pc_prune", "the word changed under the pruner", seen);
        }
        pc_node *head = (pc_node *)(seen & ~PC_TAG_MASK);
        if (head == NULL) {
            head = kept;
        } else {
            /* Only registrations move the word while PC_STATE_FIRING marks the prune: the
             * nodes pushed meanwhile stay put, and a retry finds the same tail below the
             * newer ones. */
            pc_node *tail = head;
            while (tail->next != NULL && tail->next != kept) {
                tail = tail->next;
            }
            tail->next = kept;
        }
        /* full: release publishes the relinked `next` fields to whoever takes the stack
         * next (a waiting publisher's acquire, another prune, pc_detach); acquire for the
         * retry. */
        uintptr_t was = (uintptr_t)AO_fetch_compare_and_swap_full(
            PC_WORD(&promise->state), (AO_t)seen, (AO_t)(uintptr_t)head);
        if (was == seen) {
            break;
        }
        seen = was;
    }
    *kept_count = count;
    while (dropped != NULL) {
        pc_node *next = dropped->next; /* read before release: it may free the node */
        release(dropped, context);
        dropped = next;
    }
    return true;
}

bool pc_has_waiting_observers(const pc_promise *promise) {
    /* No ordering: a snapshot of the stack head, never dereferenced; nothing is read
     * through it, so there is nothing for an acquire to make visible. */
    uintptr_t word = (uintptr_t)AO_load(PC_WORD(&promise->state));
    /* A prune in progress (pending and FIRING) holds the nodes it took: they still wait. */
    return (word & ~PC_TAG_MASK) != 0 || (word & PC_TAG_MASK) == PC_STATE_FIRING;
}

pc_node *pc_detach(pc_promise *promise) {
    /* acquire: pairs with the release pushes in pc_observe so the detached nodes' fields
     * are visible (the owner's last release already orders this; the load says so). */
    uintptr_t seen = (uintptr_t)AO_load_acquire(PC_WORD(&promise->state));
    if ((seen & PC_STATE_FIRING) != 0) {
        pc_die("pc_detach", "owner released while its observers fire", seen);
    }
    if ((seen & PC_OUTCOME_MASK) != PC_PENDING) {
        return NULL; /* settled: every observer has fired */
    }
    /* No ordering: the owner is exclusive here; emptying the word makes a second
     * pc_detach (the dying object's own deinit after its links were taken) find nothing. */
    AO_store(PC_WORD(&promise->state), (AO_t)PC_PENDING);
    return (pc_node *)(seen & ~PC_TAG_MASK);
}

/* ---- the cancellation registry ---------------------------------------------------- */

#define PC_COUNT_ONE ((uintptr_t)1u << PC_TREE_COUNT_SHIFT)

uintptr_t pc_children_push(pc_promise *promise, pc_link *link) {
    /* No ordering: only a first guess for the CAS, which validates it. */
    uintptr_t seen = (uintptr_t)AO_load(PC_WORD(&promise->children));
    for (;;) {
        link->next = (pc_link *)seen;
        /* release: publishes link->next (and the promise embedding the link) before the
         * link is reachable; pairs with the acquire CAS in pc_children_take. */
        uintptr_t was = (uintptr_t)AO_fetch_compare_and_swap_release(
            PC_WORD(&promise->children), (AO_t)seen, (AO_t)(uintptr_t)link);
        if (was == seen) {
            break;
        }
        seen = was;
    }
    /* full: besides counting (for the pruning heuristic), orders the push above before
     * the caller's next pc_tree_flags load; pairs with the full CAS in pc_tree_flags_set (Dekker:
     * a canceller either takes this link or this pusher sees its PUBLISHED bit). */
    uintptr_t before = (uintptr_t)AO_fetch_and_add_full(PC_WORD(&promise->tree_flags), (AO_t)PC_COUNT_ONE);
    return before / PC_COUNT_ONE + 1;
}

pc_link *pc_children_take(pc_promise *promise) {
    /* No ordering: first guess for the CAS. */
    uintptr_t seen = (uintptr_t)AO_load(PC_WORD(&promise->children));
    while (seen != 0) {
        /* acquire: pairs with the release push in pc_children_push, so the taken links
         * and what they point at are visible; the caller owns them from here. */
        uintptr_t was = (uintptr_t)AO_fetch_compare_and_swap_acquire(
            PC_WORD(&promise->children), (AO_t)seen, (AO_t)0);
        if (was == seen) {
            return (pc_link *)seen;
        }
        seen = was;
    }
    return NULL;
}

void pc_children_forget(pc_promise *promise, uintptr_t count) {
    /* No ordering: bookkeeping for the pruning heuristic only. */
    (void)AO_fetch_and_add(PC_WORD(&promise->tree_flags), (AO_t)(0 - count * PC_COUNT_ONE));
}

bool pc_tree_flags_set(pc_promise *promise, uintptr_t bit) {
    /* acquire: the first guess for the CAS, and what decides when the bit is set already:
     * the caller's later loads then come after it (its setter published it, full). */
    uintptr_t seen = (uintptr_t)AO_load_acquire(PC_WORD(&promise->tree_flags));
    while ((seen & bit) == 0) {
        /* full (acq_rel): release publishes what the caller stored before (a cancel reason
         * before PUBLISHED). Against a concurrent pc_children_push, whose fetch-and-add on
         * this same word follows its push: the two read-modify-writes are ordered in the
         * word's modification order, so either the pusher's reads this bit, or this CAS
         * reads the pusher's (a release) and the caller's later pc_children_take sees
         * the link. */
        uintptr_t was = (uintptr_t)AO_fetch_compare_and_swap_full(
            PC_WORD(&promise->tree_flags), (AO_t)seen, (AO_t)(seen | bit));
        if (was == seen) {
            return true;
        }
        seen = was;
    }
    return false;
}

void pc_tree_flags_update(pc_promise *promise, uintptr_t clear, uintptr_t set) {
    /* No ordering: first guess for the CAS. */
    uintptr_t seen = (uintptr_t)AO_load(PC_WORD(&promise->tree_flags));
    for (;;) {
        /* full: release publishes what the caller did before (a retirement decided, before
         * the value goes); the acquire half keeps the caller's next accesses after it. */
        uintptr_t was = (uintptr_t)AO_fetch_compare_and_swap_full(
            PC_WORD(&promise->tree_flags), (AO_t)seen, (AO_t)((seen & ~clear) | set));
        if (was == seen) {
            return;
        }
        seen = was;
    }
}

uintptr_t pc_tree_flags_after_fence(const pc_promise *promise) {
    /* full fence: orders the caller's try-retain before the loads below (StoreLoad). */
    AO_nop_full();
    unsigned spins = 0;
    for (;;) {
        /* acquire: pairs with pc_tree_flags_update's release, which decided RETIRING. */
        uintptr_t flags = (uintptr_t)AO_load_acquire(PC_WORD(&promise->tree_flags));
        if ((flags & PC_TREE_RETIRING) == 0) {
            return flags;
        }
        if (++spins > 64) {
            sched_yield(); /* the retiring thread was preempted in its few instructions */
        }
    }
}

/* ---- holds on the path of an in-flight descendant ---------------------------------- */

bool pc_holds_add_if_holding(pc_lineage *lineage, uintptr_t delta) {
    /* acquire: the first guess for the CAS, and what decides when nothing is held: the
     * caller's later accesses then come after it. */
    uintptr_t seen = (uintptr_t)AO_load_acquire(PC_WORD(&lineage->holds));
    while ((seen & ~(uintptr_t)PC_HOLDS_GONE) != 0) {
        /* full: an increment-if-holding must not let a concurrent last release pass it
         * unseen (the CAS fails if that release changed the word first). */
        uintptr_t was = (uintptr_t)AO_fetch_compare_and_swap_full(
            PC_WORD(&lineage->holds), (AO_t)seen, (AO_t)(seen + delta));
        if (was == seen) {
            return true;
        }
        seen = was;
    }
    return false;
}

uintptr_t pc_holds_add(pc_lineage *lineage, uintptr_t delta) {
    /* full (seq_cst): one side of the Dekker pairing with pc_publish; the caller then
     * reads the state with pc_state_after_hold (see the header). */
    return (uintptr_t)AO_fetch_and_add_full(PC_WORD(&lineage->holds), (AO_t)delta);
}

uintptr_t pc_holds_remove_one(pc_lineage *lineage) {
    /* full: the caller that removes the last hold then drops what the holds kept; every
     * earlier hold's changes happen before. */
    uintptr_t before = (uintptr_t)AO_fetch_and_add_full(PC_WORD(&lineage->holds),
                                                        (AO_t)(0 - (uintptr_t)PC_HOLDS_ONE));
    if (before < PC_HOLDS_ONE) {
        pc_die("pc_holds_remove_one", "removed a hold that was never added", before);
    }
    return before;
}

uintptr_t pc_holds_clear_self(pc_lineage *lineage) {
    /* acquire: the first guess for the CAS, and what decides when SELF is clear already:
     * the caller's later accesses then come after it. */
    uintptr_t seen = (uintptr_t)AO_load_acquire(PC_WORD(&lineage->holds));
    while ((seen & PC_HOLDS_SELF) != 0) {
        /* full: as pc_holds_remove_one; and only one caller clears the bit. */
        uintptr_t was = (uintptr_t)AO_fetch_compare_and_swap_full(
            PC_WORD(&lineage->holds), (AO_t)seen, (AO_t)(seen & ~(uintptr_t)PC_HOLDS_SELF));
        if (was == seen) {
            return seen;
        }
        seen = was;
    }
    return seen;
}

void pc_holds_mark_gone(pc_lineage *lineage) {
    /* acquire: the first guess for the CAS, and what decides when the bit is set already:
     * the caller's later accesses then come after it. */
    uintptr_t seen = (uintptr_t)AO_load_acquire(PC_WORD(&lineage->holds));
    while ((seen & PC_HOLDS_GONE) == 0) {
        /* full: the bit is set before the caller's following pc_holds_add, so a last
         * release that follows that add in the word's order sees it. */
        uintptr_t was = (uintptr_t)AO_fetch_compare_and_swap_full(
            PC_WORD(&lineage->holds), (AO_t)seen, (AO_t)(seen | PC_HOLDS_GONE));
        if (was == seen) {
            return;
        }
        seen = was;
    }
}

bool pc_once(uintptr_t *flag) {
    /* full: release publishes what the winner stored before (the outcome it decided); the
     * acquire half keeps the winner's following stores after the election. */
    return AO_compare_and_swap_full(PC_WORD(flag), (AO_t)0, (AO_t)1) != 0;
}

void pc_fence(void) {
    /* full (StoreLoad included): see the header. */
    AO_nop_full();
}

/* ---- calls into a user's execution context --------------------------------------- */

#if defined(__GNUC__) || defined(__clang__)
__thread unsigned pc_context_call_depth;
#else
_Thread_local unsigned pc_context_call_depth;
#endif

typedef struct {
    pc_run_fn run;
    void *item;
} pc_queued_run;

/* The calls queued for being nested too deep: a FIFO in a heap buffer, run and freed by the
 * outermost pc_context_call_end. Only this thread touches it: no atomics. */
static _Thread_local struct {
    pc_queued_run *runs;
    size_t head;
    size_t count;
    size_t capacity;
} pc_context_queue;

void pc_context_run_later(void *item, pc_run_fn run) {
    if (pc_context_queue.count == pc_context_queue.capacity) {
        size_t capacity = pc_context_queue.capacity == 0 ? 16 : 2 * pc_context_queue.capacity;
        pc_queued_run *grown = realloc(pc_context_queue.runs, capacity * sizeof *grown);
        if (grown == NULL) {
            pc_die("pc_context_run_later", "out of memory", (uintptr_t)capacity);
        }
        pc_context_queue.runs = grown;
        pc_context_queue.capacity = capacity;
    }
    pc_context_queue.runs[pc_context_queue.count++] = (pc_queued_run){run, item};
}

void pc_context_call_end(void) {
    if (pc_context_call_depth == 1 && pc_context_queue.count != 0) {
        /* Still one deep while the queue runs: a queued call nests from here, and calls
         * queued meanwhile join the end (`runs` is re-read: it may grow). */
        while (pc_context_queue.head < pc_context_queue.count) {
            pc_queued_run next = pc_context_queue.runs[pc_context_queue.head++];
            next.run(next.item);
        }
        free(pc_context_queue.runs);
        pc_context_queue.runs = NULL;
        pc_context_queue.head = pc_context_queue.count = pc_context_queue.capacity = 0;
    }
    pc_context_call_depth -= 1;
}

/* ---- combinator slots' nesting ----------------------------------------------------- */

#if defined(__GNUC__) || defined(__clang__)
__thread unsigned pc_slot_run_depth;
#else
_Thread_local unsigned pc_slot_run_depth;
#endif

/* The slots queued for being nested too deep: a FIFO linked through their nodes. Only this
 * thread touches it: no atomics. */
static _Thread_local struct {
    pc_node *head;
    pc_node *tail;
} pc_slot_queue;

void pc_slot_run_later(pc_node *node) {
    pc_fifo_push(&pc_slot_queue.head, &pc_slot_queue.tail, node);
}

void pc_slot_run_end(void) {
    if (pc_slot_run_depth == 1) {
        /* Still one deep while the queue runs: a queued slot nests from here, and slots
         * queued meanwhile join the end. */
        pc_node *node;
        while ((node = pc_fifo_pop(&pc_slot_queue.head, &pc_slot_queue.tail)) != NULL) {
            node->fire(node, NULL);
        }
    }
    pc_slot_run_depth -= 1;
}

/* ---- the walk epoch --------------------------------------------------------------- */

uintptr_t pc_walk_epoch_word; /* read inline by pc_walk_epoch (pc_registry.h) */

void pc_walk_epoch_advance(void) {
    /* full (seq_cst): the release half makes the child's claim and link visible to a walk
     * whose acquire load sees the new value; the child's cycle check fences before it
     * loads the links it walks (the second Dekker pairing in pc_registry.h). */
    (void)AO_fetch_and_add_full(PC_WORD(&pc_walk_epoch_word), (AO_t)1);
}

/* ---- the overlay's record of the runtime's layout ---------------------------------- */

uintptr_t pc_runtime_layout_word; /* read and written inline (pc_overlay.h) */

/* ---- the forwarding epoch --------------------------------------------------------- */

uintptr_t pc_forwarding_word; /* read inline by pc_forwarding_epoch (pc_registry.h) */

void pc_forwarding_begin(void) {
    /* full (seq_cst): orders this increment before the PUBLISHED bit the caller sets next,
     * so a reader whose acquire load of the tree flags sees that bit reads, in its later
     * pc_forwarding_epoch, a word still in progress or later than this one. A handler's
     * child that claims concurrently may still read the word from before this increment:
     * its claim then won the race with this cancel, which is allowed (the cancel reaches
     * it only if it is still pending when the forward gets to it). */
    (void)AO_fetch_and_add_full(PC_WORD(&pc_forwarding_word), (AO_t)1);
}

void pc_forwarding_end(void) {
    /* No ordering: a sanity check of this thread's own begin, and a first guess for the
     * CAS below, which validates it. */
    uintptr_t seen = (uintptr_t)AO_load(PC_WORD(&pc_forwarding_word));
    if ((seen & PC_FORWARDING_ACTIVE_MASK) == 0) {
        pc_die("pc_forwarding_end", "no forward in progress", 0);
    }
    for (;;) {
        /* One update both ends this forward (-1) and advances the epoch (+EPOCH_ONE).
         * At the largest epoch it stays, and the end that reached it keeps its count of
         * one in progress for good (see pc_forwarding_is_quiet). */
        const uintptr_t largest = ~(uintptr_t)PC_FORWARDING_ACTIVE_MASK;
        uintptr_t epoch_bits = seen & largest;
        uintptr_t next;
        if (epoch_bits == largest) {
            next = seen - 1u; /* the count kept for good is another end's */
        } else if (epoch_bits == largest - PC_FORWARDING_EPOCH_ONE) {
            next = seen + PC_FORWARDING_EPOCH_ONE; /* this end's count stays */
        } else {
            next = seen - 1u + PC_FORWARDING_EPOCH_ONE;
        }
        /* full: release publishes the PUBLISHED bit (and the reason before it) to a reader
         * whose acquire load in pc_forwarding_epoch sees the new word. */
        uintptr_t was = (uintptr_t)AO_fetch_compare_and_swap_full(
            PC_WORD(&pc_forwarding_word), (AO_t)seen, (AO_t)next);
        if (was == seen) {
            return;
        }
        seen = was;
    }
}

/* ---- combinators ------------------------------------------------------------------ */

uintptr_t pc_count_down(uintptr_t *counter) {
    /* full: release publishes this caller's slot writes before its decrement; acquire
     * makes all earlier decrementers' slot writes visible to the caller reaching zero. */
    uintptr_t before = (uintptr_t)AO_fetch_and_sub1_full(PC_WORD(counter));
    if (before == 0) {
        pc_die("pc_count_down", "counted below zero", before);
    }
    return before - 1;
}

/* ---- the aggregate's retirement gate ---------------------------------------------- */

bool pc_gate_enter(uintptr_t *gate) {
    /* full: the acquire half makes a retirer's drops visible before we look at the bits
     * (so we see RETIRED and keep off); the release half orders our entry before what the
     * callback then writes, which a retirer acquires through its CAS in pc_gate_leave. */
    uintptr_t before = (uintptr_t)AO_fetch_and_add_full(PC_WORD(gate), (AO_t)PC_GATE_ACTIVE_ONE);
    return (before & PC_GATE_RETIRED) == 0;
}

bool pc_gate_leave(uintptr_t *gate, bool request) {
    /* No ordering: first guess for the CAS. */
    uintptr_t seen = (uintptr_t)AO_load(PC_WORD(gate));
    for (;;) {
        if (seen < PC_GATE_ACTIVE_ONE) {
            pc_die("pc_gate_leave", "left a gate nobody entered", seen);
        }
        uintptr_t next = (seen - PC_GATE_ACTIVE_ONE) | (request ? PC_GATE_REQUESTED : 0u);
        bool retire = next == PC_GATE_REQUESTED; /* nobody inside, asked for, not retired */
        if (retire) {
            next |= PC_GATE_RETIRED;
        }
        /* full: release publishes this callback's writes (the slot it filled) to the
         * retirer; acquire gives the retirer every earlier callback's writes, so it drops
         * exactly what they kept. */
        uintptr_t was = (uintptr_t)AO_fetch_compare_and_swap_full(PC_WORD(gate), (AO_t)seen, (AO_t)next);
        if (was == seen) {
            return retire;
        }
        seen = was;
    }
}

/* ---- locked words ----------------------------------------------------------------- */


bool pc_word_publish(uintptr_t *word, uintptr_t value) {
    if ((value & PC_WORD_LOCKED) != 0 || value == 0) {
        pc_die("pc_word_publish", "value is 0 or has the lock bit", value);
    }
    /* release: publishes the target's initialisation to a reader whose acquire
     * (pc_word_load) sees the value; one CAS from 0 elects the one publisher. */
    return AO_compare_and_swap_release(PC_WORD(word), (AO_t)0, (AO_t)value) != 0;
}

void pc_word_store(uintptr_t *word, uintptr_t value) {
    if ((value & PC_WORD_LOCKED) != 0) {
        pc_die("pc_word_store", "value has the lock bit", value);
    }
    /* release: publishes the target's initialisation (and the caller's earlier writes)
     * to a reader whose acquire (pc_word_load, pc_word_lock) sees the value. */
    AO_store_release(PC_WORD(word), (AO_t)value);
}

uintptr_t pc_word_take(uintptr_t *word) {
    for (;;) {
        /* acquire: a guess for the CAS, which validates it, and what decides when the word
         * is empty: the caller's later accesses then come after it. */
        AO_t seen = AO_load_acquire(PC_WORD(word));
        if (seen == 0) {
            return 0;
        }
        /* full: elects the one caller whose CAS moves the value to 0, and keeps the take
         * in place among the caller's accesses. (The storer's writes before its plain
         * store reach the takers through the hand-off that starts them, see the header.) */
        if (AO_compare_and_swap_full(PC_WORD(word), seen, (AO_t)0)) {
            return (uintptr_t)seen;
        }
    }
}

uintptr_t pc_word_take_marked(uintptr_t *word, uintptr_t mask) {
    for (;;) {
        /* seq_cst: this load decides, for an unmarked value, that there is nothing to
         * take, and it is the load side of the Dekker pairing below (the caller's claim,
         * a full CAS, came before it; see pc_word_load_after_rmw for why not acquire). */
        AO_t seen = (AO_t)__atomic_load_n(word, __ATOMIC_SEQ_CST);
        if ((seen & mask) == 0) {
            return 0;
        }
        /* full: elects the one caller whose CAS moves the value to 0, and keeps the take
         * in place among the caller's accesses, as in pc_word_take; and it is the
         * read-modify-write of a Dekker pairing whose other side stores the value, fences,
         * then reads what this caller's earlier full read-modify-write wrote (a child's
         * claim: the overlay's parked parent hold). */
        if (AO_compare_and_swap_full(PC_WORD(word), seen, (AO_t)0)) {
            return (uintptr_t)seen;
        }
    }
}

uintptr_t pc_word_lock(uintptr_t *word) {
    for (unsigned failures = 0;; failures++) {
        /* No ordering: a guess for the CAS, which validates it. */
        uintptr_t seen = (uintptr_t)AO_load(PC_WORD(word));
        /* acquire: pairs with the release store in pc_word_unlock, so what the previous
         * holder did under the lock (a reader's try on the target, a clearer's 0) happens
         * before what we do under it: a clearer that locks after a reader frees the target
         * only after the reader's try, and a reader that locks after a clearer sees 0. */
        if ((seen & PC_WORD_LOCKED) == 0
            && AO_compare_and_swap_acquire(PC_WORD(word), (AO_t)seen, (AO_t)(seen | PC_WORD_LOCKED))) {
            return seen;
        }
        if (failures >= PC_SPINS_BEFORE_YIELD) {
            sched_yield();
        }
    }
}

void pc_word_unlock(uintptr_t *word, uintptr_t value) {
    /* No ordering: this thread holds the lock, so it reads its own write. */
    uintptr_t held = (uintptr_t)AO_load(PC_WORD(word));
    if ((held & PC_WORD_LOCKED) == 0 || (value & PC_WORD_LOCKED) != 0) {
        pc_die("pc_word_unlock", "lock not held, or value has the lock bit", held);
    }
    /* release: pairs with the acquire CAS of the next pc_word_lock (see there). */
    AO_store_release(PC_WORD(word), (AO_t)value);
}

static uintptr_t pc_diagnostics_handler_word;

uintptr_t *pc_diagnostics_word(void) {
    return &pc_diagnostics_handler_word;
}
