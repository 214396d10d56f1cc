/*
 * core.pml: a Promela model of CPromiseCore's protocol, as written in
 * Sources/CPromiseCore/CPromiseCore.c. Each step names the C function (and the C
 * statement) it stands for. Run it with `make verify` (see Verification/README.md).
 *
 * Two models share this file; a verification run picks one:
 *
 *   (default)       the observer protocol of one promise: the state word, CAS push of
 *                   observers (pc_observe), the claim CAS electing one settler among
 *                   fulfil / reject / cancel / follow (pc_claim), publish-and-take with
 *                   PC_STATE_FIRING and the late-registration loop (pc_publish), reversal and
 *                   firing (pc_fire_in_order), registration that finds the promise settled
 *                   and fires itself (pc_observe), registration from inside a fire
 *                   callback.
 *   -DREGISTRY      the cancellation registry of one settled promise (pc_children_push,
 *                   pc_children_take, pc_tree_flags_set, pc_tree_flags) as the Swift layer drives it
 *                   (AnyPromise.cancelOne, linkIntoParentChain, forEachLinkedChild): one
 *                   or two cancellers against children that push links, possibly pruning
 *                   (-DNCHILD, -DNPRUNE, -DNCANCEL size it). With -DCLAIM_WINDOW, P is
 *                   claimed by its handler but not yet published, and its claim may turn
 *                   into an ancestor's cancel: cancellers, P's publisher, linked children
 *                   (`make verify-claim-window`: a finding, the reasons split).
 *
 *   -DCYCLE         promises locking in to follow each other at the same time, and the
 *                   cycle check (a link store, a full fence, a walk of the links) that
 *                   keeps a ring of them from waiting for ever (-DNRING sizes it).
 *   -DGATE          an aggregate's retirement gate (pc_gate_enter / pc_gate_leave): slot
 *                   callbacks racing the one that finds the output settled.
 *   -DREACH_MODEL   cancel reach: a root's cancel against a leaf going in flight two
 *                   steps below it, a side branch of the leaf that linked it early and then
 *                   settled, and the death of a step nobody holds (enterFlight, holds,
 *                   registry, deinit, forwarding; whole operations as single steps).
 *   -DPRUNE         observers that gave up leave a pending promise (pc_prune): the
 *                   pruner against registrations, give-ups and a publisher that meets it.
 *   -DCASCADE_MODEL a cascade keeps the path its inline handlers look up through: a
 *                   chain's step keeps its parent, a follower settling inside a cascade
 *                   keeps its holds, against a cancel of the root.
 *   -DLIFETIME_MODEL the lifetime model's rules together (holds, links, cascade keeps,
 *                   follow locks, early settles, deaths) against the property: a cancel of
 *                   any live ancestor reaches every pending descendant, and every
 *                   reference is released once, after its last user.
 *   -DHOLDS         the holds words (pc_holds_*) as the overlay drives them
 *                   (AnyPromise.addHold / removeHold): two children going in flight under
 *                   one settled parent while their settlers drop their holds.
 *   -DRETIRE_MODEL  a cascade frees a kept step's value early when nothing else reaches
 *                   it (freeValueIfOnlyTheCascadeKeepsIt), against a reader that reaches it
 *                   through `parent` (a try-retain, then the flag) and keeps an unowned
 *                   reference of its own, and one that flips a weak reference to strong.
 *   -DPARK_MODEL    a child's hold on its parent parked for the work its context will run
 *                   (parkSettledParentForContext), against a cancel of the child that takes
 *                   it first (dropHandlerParkedForContext) and the work, which may never run.
 *
 * Deliberately broken variants (each must FAIL, `make verify-broken`):
 *
 *   -DBROKEN_PLAIN_STORE   pc_observe pushes with a plain load + store instead of the CAS:
 *                          it does not re-check the word it read before writing it.
 *   -DBROKEN_IGNORE_FIRING pc_observe fires itself as soon as it sees an outcome tag,
 *                          ignoring PC_STATE_FIRING.
 *   -DBROKEN_STALE_RETRY   pc_observe retries a failed CAS without reloading the word
 *                          (a livelock: only the liveness run can see it).
 *   -DREGISTRY -DBROKEN_DEKKER
 *                          a child reads the tree_flags word before its push is visible (what
 *                          the StoreLoad reordering allows if pc_children_push's full
 *                          fetch-add were not a full barrier).
 *   -DREGISTRY -DNCANCEL=2 -DBROKEN_LOSER_WALKS
 *                          a canceller that lost the forwarding to another, whose reason is
 *                          not out yet, walks the registry with its own reason.
 *
 *   -DCYCLE -DBROKEN_NO_FENCE
 *                          the cycle check's walk reads the ring before the promise's own
 *                          link store is visible (no fence between them).
 *   -DCYCLE -DBROKEN_CHECK_FIRST
 *                          the cycle check reads its own observers before registering on
 *                          the promise it follows.
 *   -DREACH_MODEL -DBROKEN_HOLD_IF_UNLINKED
 *                          enterFlight takes the path hold only if it is the one that links
 *                          the promise (what `linked` meant before it meant reachability only).
 *   -DGATE -DBROKEN_GATE_IGNORES_INSIDE
 *                          the retirement gate retires on a request whatever the number of
 *                          callbacks inside.
 *   -DHOLDS -DBROKEN_BOTTOM_UP
 *                          addHold makes a promise's first hold visible before its parent
 *                          counts one for it (the order this session's first version used).
 *   -DHOLDS -DBROKEN_NO_STATE_CHECK
 *                          the promise going in flight does not read the state word after
 *                          its SELF is visible (holdPathWhileInFlight's half of the Dekker
 *                          pairing left out).
 *   -DHOLDS -DBROKEN_SELF_TEST_THEN_CLEAR
 *                          dropping SELF reads the bit, then clears it in a second step
 *                          (not pc_holds_clear_self's one CAS).
 *
 *   -DPRUNE -DBROKEN_PRUNE_ON_TOP, -DBROKEN_PRUNE_NO_WAIT, -DBROKEN_PRUNE_PLAIN_PUT_BACK
 *                          the pruner puts its nodes back above newer ones; the publisher
 *                          ignores a prune in progress; the pruner puts its nodes back with a
 *                          plain store (see Model 9).
 *   -DCASCADE_MODEL -DBROKEN_CHAIN_DROPS_PARENT, -DBROKEN_FOLLOWER_DROPS_PATH
 *                          a chain's step lets its parent go when its handler is done; a
 *                          follower drops its holds right after its publish (Model 10).
 *   -DRETIRE_MODEL -DBROKEN_RETIRE_NO_RECHECK, -DBROKEN_RETIRE_SEPARATE_READS
 *                          the retirer frees the value right after setting the flag,
 *                          without a second snapshot; it reads the strong, weak and
 *                          unowned counts one after the other (Model "retire").
 *   -DPARK_MODEL -DBROKEN_PARK_NO_RECHECK, -DBROKEN_PARK_NO_FENCE
 *                          the parker sends the work without reading the claim after its
 *                          store; it reads the claim before its store is visible (Model
 *                          "park").
 *
 * Not a broken variant: -DDEFERRED_ORDER (`make verify-deferred-order`) adds what the
 * trampoline does with an .immediate observer's body (pc_defer in the fire callback, run
 * by pc_drain when the outermost scope on that thread ends) and asserts that a registrar's
 * bodies run in its registration order. The real protocol FAILS it: see the README.
 *
 * Assumption: sequential consistency. Every shared access is one atomic step; the
 * release / acquire / full orderings of the C code are not modelled (ThreadSanitizer and
 * the stress tests in Tests/CoreTests cover them). The per-thread trampoline (pc_defer,
 * pc_drain) touches thread-local data only and is not modelled (but see DEFERRED_ORDER);
 * neither is pc_detach (the owner's deinit, exclusive by contract).
 *
 * Words are integers: a node is a small id (1..), NULL is 0, and a state word is
 * head * 8 + tags, as in the C code, where nodes are 8-byte aligned and the low three
 * bits are PC_OUTCOME_MASK (3) and PC_STATE_FIRING (4).
 */

#define PENDING   0   /* PC_PENDING */
#define FULFILLED 1   /* PC_FULFILLED */
#define REJECTED  2   /* PC_REJECTED */
#define CANCELLED 3   /* PC_CANCELLED */
#define FOLLOWING 4   /* PC_CLAIM_FOLLOWING (claim word only) */
#define FREE      0   /* PC_CLAIM_FREE (claim word only) */
#define OUTCOME_MASK 3  /* PC_OUTCOME_MASK */
#define FIRING    4   /* PC_STATE_FIRING */
#define TAG_MASK  7   /* PC_TAG_MASK */

#define HEAD(w)    ((w) / 8)            /* (pc_node *)(w & ~PC_TAG_MASK) */
#define WORD(h, t) ((h) * 8 + (t))      /* (uintptr_t)node | tags */

#if !defined(REGISTRY) && !defined(EPOCH) && !defined(CYCLE) && !defined(HOLDS) && !defined(GATE) && !defined(REACH_MODEL) && !defined(PRUNE) && !defined(CASCADE_MODEL) && !defined(LIFETIME_MODEL) && !defined(RETIRE_MODEL) && !defined(PARK_MODEL) && !defined(WALK_MODEL)
/* ======================================================================================
 * Model 1: the observer protocol of one promise.
 *
 * Registrars (pc_observe callers):
 *   A registers nodes 1 then 2, in sequence (its own registration order must be kept);
 *   B registers node 3; C registers node 4.
 *   The fire callback of node 1 registers node 5 (R) on the same promise, from whatever
 *   thread fires node 1: the publisher while PC_STATE_FIRING is set, or A itself.
 * Settlers (racing resolvers, Promise.fulfill / reject / cancel / resolve(with:)):
 *   fulfil:  pc_claim(FREE -> FULFILLED)
 *   reject:  pc_claim(FREE -> REJECTED)
 *   cancel:  pc_claim(FREE -> CANCELLED) || pc_claim(FOLLOWING -> CANCELLED)
 *   follow:  pc_claim(FREE -> FOLLOWING), then the followee settles (fulfilled) and its
 *            FollowObserver runs pc_claim(FOLLOWING -> FULFILLED)
 *   The winner stores the outcome value (`value`), then calls pc_publish.
 * ====================================================================================== */

#define NNODES   5
#define TRIGGER  1           /* node whose fire callback registers R */
#define R        5           /* the node registered from inside TRIGGER's fire callback */

/* The registration that must precede n for its registrar (0: none). */
#define PREV(n)  ((n) == 2 -> 1 : ((n) == R -> TRIGGER : 0))

byte state = 0;              /* pc_promise.state: observer stack head | FIRING | outcome */
byte claim = FREE;           /* pc_promise.claim */
byte value = 0;              /* the outcome value, in memory the claim winner owns */
byte nxt[NNODES + 1];        /* pc_node.next */

/* Ghost state, for the properties only. */
bit  fired[NNODES + 1];      /* node n has fired */
byte pushOrder[NNODES + 1];  /* position of n in the linearisation of successful pushes */
byte pushCount = 0;          /* successful pushes so far */
byte firedPushed = 0;        /* pushed nodes fired so far */
byte winners = 0;            /* claims that moved the claim word to an outcome */
#ifdef DEFERRED_ORDER
byte bodiesRun = 0;          /* deferred bodies of pushed nodes run so far (FIFO) */
byte firedPos[NNODES + 1];   /* n was the k-th pushed node fired (0: fired itself) */
#endif

#define ALL_FIRED (fired[1] && fired[2] && fired[3] && fired[4] && fired[5])

/* Registration order is the order of the successful pushes (the linearisation points);
 * a node that fires itself (found the promise quiescent) registered after all of them. */
inline record_push(n) {
    pushCount++;
    pushOrder[n] = pushCount
}

/* node->fire(node, promise) from pc_fire_in_order, on the publisher's thread. */
inline fire_from_publisher(n) {
    d_step {
        assert(fired[n] == 0);                                  /* fires once */
        assert((state & OUTCOME_MASK) == outcome);              /* after the publishing CAS */
        assert(value == outcome && claim == outcome);           /* with the winning outcome */
        assert(pushOrder[n] == firedPushed + 1);                /* in registration order */
        assert(PREV(n) == 0 || fired[PREV(n)]);                 /* a registrar's order kept */
        printf("%d: pc_publish fires node %d (outcome %d)\n", _pid, n, outcome);
        firedPushed++;
#ifdef DEFERRED_ORDER
        firedPos[n] = firedPushed;
#endif
        fired[n] = 1;
        pushOrder[n] = 0;              /* handed back: forget what no longer matters */
        nxt[n] = 0;
        if
        :: n == TRIGGER -> reg = R     /* the callback registers R: see below */
        :: else
        fi
    }
}

/* node->fire(node, promise) at the end of pc_observe, on the registrar's thread. */
inline fire_self(n) {
    d_step {
        assert(fired[n] == 0);                                  /* fires once */
        assert((state & OUTCOME_MASK) != PENDING);              /* after the publishing CAS */
        assert(value != PENDING && value == (state & OUTCOME_MASK) && claim == value);
        assert(pushOrder[n] == 0 && firedPushed == pushCount);  /* after every pushed node */
        assert(PREV(n) == 0 || fired[PREV(n)]);                 /* a registrar's order kept */
        printf("%d: node %d fires itself in pc_observe (outcome %d)\n", _pid, n, value);
#ifdef DEFERRED_ORDER
        /* an .immediate node defers its body; this pc_observe is the outermost scope on
         * its thread, so pc_scope_leave drains it now: every earlier-registered body
         * should have run */
        printf("%d: node %d runs its deferred body\n", _pid, n);
        /* its registrar's previous node: fired itself (body ran), or its body was drained */
        assert(PREV(n) == 0 || firedPos[PREV(n)] <= bodiesRun);
#endif
        fired[n] = 1;
        if
        :: n == TRIGGER -> reg = R
        :: else
        fi
    }
}

/* void pc_observe(pc_promise *promise, pc_node *node), CPromiseCore.c */
inline pc_observe(node, seen, ok) {
    seen = state;                                   /* seen = AO_load_acquire(&state) */
    do
    :: (seen & OUTCOME_MASK) != PENDING && ((seen & FIRING) == 0
#ifdef BROKEN_IGNORE_FIRING
                                            || true
#endif
                                           ) ->
        break                                       /* settled and quiescent: fire below */
    :: else ->
#ifndef BROKEN_PLAIN_STORE
        /* node->next = seen & ~TAG_MASK;  (node is private until the CAS: one step)
         * was = AO_fetch_compare_and_swap_release(&state, seen, node | tags) */
        d_step {
            if
            :: state == seen ->
                nxt[node] = HEAD(seen);
                state = WORD(node, seen & TAG_MASK);
                printf("%d: pc_observe(node %d): CAS push, state (head %d, tags %d) -> (head %d, tags %d)\n",
                       _pid, node, HEAD(seen), seen & TAG_MASK, node, seen & TAG_MASK);
                record_push(node);
                ok = true
            :: else ->
                printf("%d: pc_observe(node %d): CAS fails, expected (head %d, tags %d), word is (head %d, tags %d)\n",
                       _pid, node, HEAD(seen), seen & TAG_MASK, HEAD(state), state & TAG_MASK);
                ok = false
            fi
        };
#else
        /* BROKEN: node->next = head; state = node | tags, a plain store of the word read
         * above, without re-checking that it still holds `seen`. */
        nxt[node] = HEAD(seen);
        d_step {
            printf("%d: pc_observe(node %d): PLAIN STORE, state (head %d, tags %d) -> (head %d, tags %d)\n",
                   _pid, node, HEAD(state), state & TAG_MASK, node, seen & TAG_MASK);
            state = WORD(node, seen & TAG_MASK);
            record_push(node)
        };
        ok = true;
#endif
        if
        :: ok -> break                              /* was == seen: return */
#ifndef BROKEN_STALE_RETRY
        :: else -> seen = state                     /* seen = AO_load_acquire(&state) */
#else
        :: else -> skip                             /* BROKEN: retry with the stale word */
#endif
        fi
    od;
    if
    :: ok -> skip                                   /* pushed: the settler fires it */
    :: else -> fire_self(node)                      /* node->fire(node, promise) */
    fi;
    seen = 0;
    ok = false
}

/* The claim word CAS: bool pc_claim(promise, expected, desired). */
inline pc_claim(expected, desired, won) {
    d_step {
        if
        :: claim == expected ->
            printf("%d: pc_claim(%d -> %d) wins\n", _pid, expected, desired);
            claim = desired;
            if
            :: desired != FOLLOWING ->
                winners++;
                assert(winners == 1)                /* exactly one settle wins */
            :: else
            fi;
            won = true
        :: else ->
            won = false
        fi
    }
}

/* void pc_publish(pc_promise *promise), CPromiseCore.c, with pc_fire_in_order inlined. */
inline pc_publish() {
    outcome = claim;                                /* outcome = AO_load(&claim) */
    assert(outcome >= FULFILLED && outcome <= CANCELLED);   /* pc_die: no outcome */
    seen = state;                                   /* seen = AO_load(&state) */
    assert((seen & TAG_MASK) == PENDING);           /* pc_die: published twice */
    do
    :: stack = HEAD(seen);
        nextw = (stack != 0 -> (outcome | FIRING) : outcome);
        /* was = AO_fetch_compare_and_swap_full(&state, seen, next);
         * if (was != seen) { seen = was; continue; } */
        d_step {
            if
            :: state == seen ->
                printf("%d: pc_publish: CAS state (head %d, tags %d) -> (head 0, tags %d)\n",
                       _pid, HEAD(seen), seen & TAG_MASK, nextw);
                state = nextw; ok = true
            :: else -> seen = state; ok = false
            fi
        };
        if
        :: !ok -> skip                              /* continue */
        :: ok && stack == 0 -> break                /* quiescent: late observers fire themselves */
        :: ok && stack != 0 ->
            /* pc_fire_in_order: reverse the taken stack (now private to this thread) */
            d_step {
                ordered = 0;
                do
                :: stack != 0 ->
                    n = nxt[stack]; nxt[stack] = ordered; ordered = stack; stack = n
                :: else -> break
                od;
                n = 0
            };
            /* while (ordered) { next = ordered->next; ordered->fire(ordered, source); ... } */
            do
            :: ordered != 0 ->
                n = ordered;
                nx = nxt[n];                        /* read before fire */
                fire_from_publisher(n);
                if
                :: reg != 0 ->                      /* inside the callback: pc_observe(R) */
                    rnode = reg;
                    reg = 0;
                    pc_observe(rnode, rseen, rok);
                    rnode = 0
                :: else
                fi;
                ordered = nx
            :: else -> break
            od;
            n = 0;
            nx = 0;
            seen = nextw                            /* seen = next; the CAS tells the rest */
        fi
    od;
#ifdef DEFERRED_ORDER
    /* pc_scope_leave -> pc_drain: the bodies the fire callbacks above deferred run now,
     * in firing order, after the word went quiescent */
    do
    :: bodiesRun < firedPushed ->
        d_step {
            bodiesRun++;
            printf("%d: pc_drain runs the deferred body of the %d-th pushed node\n", _pid, bodiesRun)
        }
    :: else -> break
    od;
#endif
    seen = 0; stack = 0; nextw = 0; ok = false
}

/* Locals of the processes: pc_observe's (node, seen, ok, and a second set for the
 * registration made from inside TRIGGER's fire callback), pc_publish's. */
#define REGISTRAR_LOCALS \
    bool ok, rok; \
    byte seen, reg, rnode, rseen
#define PUBLISHER_LOCALS \
    REGISTRAR_LOCALS; \
    bool won; \
    byte outcome, stack, nextw, ordered, n, nx

/* Promise.fulfill / reject / cancel: claim from FREE (cancel also takes over from
 * FOLLOWING, AnyPromise.settleFailure), store the value, publish. */
proctype Settler(byte kind) {
    PUBLISHER_LOCALS;
    pc_claim(FREE, kind, won);
    if
    :: !won && kind == CANCELLED -> pc_claim(FOLLOWING, CANCELLED, won)
    :: else
    fi;
    if
    :: won ->
        value = kind;                               /* the winner stores the outcome value */
        pc_publish()
    :: else
    fi
}

/* Promise.resolve(with:): lock as FOLLOWING; the followee then settles with `tag` and the
 * FollowObserver's run claims FOLLOWING -> tag (it loses if a cancel took over). */
proctype Follower(byte tag) {
    PUBLISHER_LOCALS;
    pc_claim(FREE, FOLLOWING, won);
    if
    :: won ->
        pc_claim(FOLLOWING, tag, won);
        if
        :: won -> value = tag; pc_publish()
        :: else
        fi
    :: else
    fi
}

/* A thread that registers `count` nodes first, first + 1, ... in sequence. */
proctype Registrar(byte first; byte count) {
    REGISTRAR_LOCALS;
    byte i = 0;
    do
    :: i < count ->
        rnode = first + i;
        pc_observe(rnode, seen, ok);
        if
        :: reg != 0 ->                              /* TRIGGER fired here: its callback */
            rnode = reg;                            /* registers R (finds it quiescent) */
            reg = 0;
            pc_observe(rnode, rseen, rok)
        :: else
        fi;
        i++
    :: else -> break
    od;
    rnode = 0; i = 0
}

init {
    atomic {
        run Registrar(1, 2);            /* A: nodes 1, 2 */
        run Registrar(3, 1);            /* B: node 3 */
        run Registrar(4, 1);            /* C: node 4 */
        run Settler(FULFILLED);
        run Settler(REJECTED);
        run Settler(CANCELLED);
        run Follower(FULFILLED)
    }
    timeout;                            /* nothing can move: every call has returned (no
                                           statement of the model blocks) */
    assert(winners == 1);               /* exactly one settle won */
    assert(ALL_FIRED)                   /* every registered observer fired */
}

/* Liveness, checked with `pan -a`: every run fires every observer. */
ltl all_fire { <> (ALL_FIRED && _nr_pr <= 1) }

#elif defined(REGISTRY)
/* ======================================================================================
 * Model 2: the cancellation registry of one promise P that settled (fulfilled).
 *
 * Canceller (AnyPromise.cancelOne(P) + the cancel work loop): settleFailure fails (P is
 * fulfilled, not cancelled), pc_tree_flags_set(P, CANCEL_CLAIMED) wins, it stores the reason
 * (forwardedCancelReason), pc_tree_flags_set(P, CANCEL_PUBLISHED), then
 * forEachLinkedChild(reapplyingCancel: false): pc_children_take, queue every live child,
 * push the links back, and cancel the queued children.
 * Children 1..NCHILD (AnyPromise.linkIntoParentChain, in sourceDidSettle): each pushes
 * its link (pc_children_push), may prune (forEachLinkedChild(reapplyingCancel: true),
 * which addChildLink runs when the count hits a power of two: any push may here), then
 * reads P's tree_flags word and cancels itself if CANCEL_PUBLISHED is set; otherwise its
 * continuation runs and fulfils it (unless a cancel got there first).
 *
 * A child's cancel (AnyPromise.cancelOne(child)): settleFailure = pc_claim(child,
 * FREE -> CANCELLED); failing that, if the child is not cancelled, pc_tree_flags_set(child,
 * CANCEL_CLAIMED) for a settled child. Links are the children's ids.
 * ====================================================================================== */

#ifndef NCHILD
#define NCHILD 3     /* children pushing links */
#endif
#ifndef NPRUNE
#define NPRUNE 0     /* children 1..NPRUNE may prune after their push */
#endif
#ifndef NCANCEL
#define NCANCEL 1    /* cancellers of P */
#endif
#define CLAIMED   2  /* PC_TREE_CANCEL_CLAIMED */
#define PUBLISHED 4  /* PC_TREE_CANCEL_PUBLISHED */

byte children = 0;           /* P.children: head of the link stack (0: NULL) */
byte lnext[NCHILD + 1];      /* link->next */
byte tree_flags = 0;             /* P.tree_flags: CANCEL_CLAIMED | CANCEL_PUBLISHED (LINKED and the
                                count from bit 4 up are pruning bookkeeping: not modelled) */
byte reason = 0;             /* P.forwardedCancelReason (0: none stored); canceller k's is k */
byte cclaim[NCHILD + 1];     /* each child's claim word */
byte ctree_flags[NCHILD + 1];    /* each child's tree_flags word (CANCEL_CLAIMED) */

/* Ghost state, for the properties only. */
bit  pushed[NCHILD + 1];     /* the child's own link push happened */
bit  takenByCanceller[NCHILD + 1];
bit  sawPublished[NCHILD + 1];   /* the pusher read CANCEL_PUBLISHED after its push */
bit  prunerSaw[NCHILD + 1];      /* a pruner that held the link saw CANCEL_PUBLISHED */
bit  reached[NCHILD + 1];        /* child.cancel(reason:) was called */
bit  settled[NCHILD + 1];        /* the child's claim moved to an outcome */
bit  forwarded[NCHILD + 1];      /* CANCEL_CLAIMED was set on the (settled) child */
byte creason[NCHILD + 1];        /* the reason the cancel that settled or forwarded it passed */

#ifdef CLAIM_WINDOW
/* P is claimed by its handler (fulfillFromHandler) and not yet published: its claim may
 * still turn into the cancel an ancestor forwarded (turnClaimIntoCancel, reason 3). */
#define ANCESTOR_REASON 3
byte pclaim = FULFILLED;     /* P's claim word */
bit  ppublished = 0;         /* pc_publish(P) happened */
byte preason = 0;            /* P's own cancel reason, once its claim turned */
#endif

/* uintptr_t pc_children_push(promise, link): CAS loop, then the full fetch-add. */
inline pc_children_push(link) {
    seen = children;                                /* seen = AO_load(&children) */
    do
    :: d_step {                                     /* link->next = seen; CAS release; */
           if                                       /* on failure seen = was */
           :: children == seen ->
               printf("%d: pc_children_push(link %d) onto %d\n", _pid, link, seen);
               lnext[link] = seen; children = link; ok = true
           :: else -> seen = children; ok = false
           fi
       };
       if
       :: ok -> break
       :: else
       fi
    od;
    seen = 0; ok = false
    /* AO_fetch_and_add_full(&tree_flags, PC_COUNT_ONE): the count is not modelled; its
     * StoreLoad barrier orders the push before the pusher's next pc_tree_flags load, which
     * sequential consistency gives every step of the model. */
}

/* pc_node *pc_children_take(promise): CAS loop to NULL; the taken stack goes to `list`. */
inline pc_children_take(list) {
    d_step {
        seen = children;                            /* seen = AO_load(&children) */
        if
        :: seen == 0 -> printf("%d: pc_children_take finds the registry empty\n", _pid)
        :: else
        fi
    };
    list = 0;
    do
    :: seen == 0 -> break                           /* return NULL */
    :: else ->
        d_step {                                    /* CAS acquire (seen -> 0) */
            if
            :: children == seen ->
                printf("%d: pc_children_take takes the stack headed by %d\n", _pid, seen);
                children = 0; list = seen; ok = true
            :: else -> seen = children; ok = false
            fi
        };
        if
        :: ok -> break
        :: else
        fi
    od;
    seen = 0; ok = false
}

/* bool pc_tree_flags_set(promise, bit): CAS loop (full) that sets `bit`; true for the one
 * call that set it. */
inline pc_tree_flags_set(bitv, won) {
    seen = tree_flags;                                  /* seen = AO_load(&tree_flags) */
    won = false;
    do
    :: (seen & bitv) != 0 -> break                  /* set by somebody else: false */
    :: else ->
        d_step {
            if
            :: tree_flags == seen ->
                printf("%d: pc_tree_flags_set(%d): tree_flags %d -> %d\n", _pid, bitv, seen, seen | bitv);
                tree_flags = seen | bitv; won = true
            :: else -> seen = tree_flags
            fi
        };
        if
        :: won -> break
        :: else
        fi
    od;
    seen = 0
}

/* child.cancel(reason: r) -> cancelOne(child); the child's own registry is empty here. */
inline cancel_child(c, r) {
    /* settleFailure: pc_claim(child, FREE, CANCELLED) */
    d_step {
        printf("%d: cancel(child %d)\n", _pid, c);
        reached[c] = 1;
        if
        :: cclaim[c] == FREE ->
            assert(!settled[c]);                    /* a child settles once */
            cclaim[c] = CANCELLED; settled[c] = 1; creason[c] = r;
            done = true
        :: else -> done = false
        fi
    };
    /* else if !isCancelled, pc_tree_flags_set(child, CANCEL_CLAIMED) (the claim is settled
     * and stays so: isCancelled and the CAS are one step here) */
    if
    :: !done ->
        d_step {
            if
            :: cclaim[c] != CANCELLED && (ctree_flags[c] & CLAIMED) == 0 ->
                assert(!forwarded[c]);              /* a settled child is forwarded once */
                ctree_flags[c] = ctree_flags[c] | CLAIMED; forwarded[c] = 1; creason[c] = r
            :: else
            fi
        }
    :: else
    fi;
    done = false
}

/* forEachLinkedChild(reapplyingCancel:): take, walk, push the (live) links back in their
 * old order, forget; with reapplyingCancel, cancel them if P's reason is out. Every child
 * is alive, so every link is kept. */
inline for_each_linked_child(reapplying, byCanceller) {
    pc_children_take(list);
    /* walk the taken list (private now), newest first, into tk[] */
    d_step {
        nk = 0;
        kept = 0;
        do
        :: list != 0 ->
            tk[nk] = list; nk++;
            kept = kept | (1 << list);
            if
            :: byCanceller -> takenByCanceller[list] = 1
            :: else
            fi;
            list = lnext[list]
        :: else -> break
        od
    };
    /* for link in kept.reversed() { pc_children_push(link) }: oldest first */
    do
    :: nk > 0 ->
        nk--;
        l = tk[nk];
        tk[nk] = 0;
        pc_children_push(l);
        l = 0
    :: else -> break
    od;
    /* pc_children_forget(taken): bookkeeping only.
     * if reapplyingCancel, !kept.isEmpty, let reason = cancelReasonForDescendants */
    if
    :: reapplying && kept != 0 && (tree_flags & PUBLISHED) != 0 ->
        assert(reason != 0);                        /* the reason is visible */
        c = 1;
        do
        :: c <= NCHILD ->
            if
            :: (kept & (1 << c)) != 0 -> prunerSaw[c] = 1; cancel_child(c, reason)
            :: else
            fi;
            c++
        :: else -> break
        od;
        c = 0
    :: else
    fi
}

#define REGISTRY_LOCALS \
    bool ok, won, done; \
    byte seen, list, kept, l, c, nk; \
    byte tk[NCHILD]

/* cancel(reason: me) on P: cancelOne(P), then the work loop over the children it queued. */
proctype Canceller(byte me) {
    REGISTRY_LOCALS;
    byte passed;
#ifdef CLAIM_WINDOW
    /* settleFailure(P) fails: P is claimed. else if isClaimedAsCancel && !isCancelled
     * { return }: its publisher walks; isCancelled: no forwarding, walk with its reason */
    if
    :: pclaim == CANCELLED && !ppublished ->
        printf("%d: canceller %d finds P claimed as cancelled, not published\n", _pid, me);
        goto walked
    :: pclaim == CANCELLED && ppublished -> goto walk
    :: else
    fi;
#endif
    /* settleFailure(P) fails (P is fulfilled); !isCancelled;
     * pc_tree_flags_set(P, CANCEL_CLAIMED) */
    pc_tree_flags_set(CLAIMED, won);
    if
    :: won ->
        reason = me;                                /* forwardedCancelReason = reason */
        pc_tree_flags_set(PUBLISHED, won);              /* pc_tree_flags_set(P, CANCEL_PUBLISHED) */
        assert(won)
#ifndef BROKEN_LOSER_WALKS
    :: else ->
        /* else if !carriesCancelForDescendants { return }: the winner has not published
         * its reason yet, and walks once it has */
        if
        :: (tree_flags & PUBLISHED) == 0 ->
            printf("%d: canceller %d lost the forwarding, leaves the walk to the winner\n", _pid, me);
            goto walked
        :: else
        fi
#else
    :: else                                         /* BROKEN: walks with its own reason */
#endif
    fi;
    won = false;
#ifdef CLAIM_WINDOW
walk:
#endif
    for_each_linked_child(false, true);             /* work.append(child) for each link */
    /* passedOn = cancelReasonForDescendants ?? reason */
    d_step {
        if
#ifdef CLAIM_WINDOW
        :: pclaim == CANCELLED && ppublished -> passed = preason
#endif
        :: (tree_flags & PUBLISHED) != 0 -> passed = reason
        :: else -> passed = me
        fi
    };
    c = 1;                                          /* while let promise = work.popLast() */
    do
    :: c <= NCHILD ->
        if
        :: (kept & (1 << c)) != 0 -> cancel_child(c, passed)
        :: else
        fi;
        c++
    :: else -> break
    od;
    c = 0; kept = 0; passed = 0;
walked:
    skip
}

/* A child in flight after P settled: AnyPromise.linkIntoParentChain (from sourceDidSettle)
 * pushes its link; then either P's cancel reason is out and it cancels itself, or its
 * continuation runs and fulfils it (runContinuation: unless it was claimed meanwhile). */
proctype Child(byte me) {
    REGISTRY_LOCALS;
#ifdef BROKEN_DEKKER
    /* BROKEN: the pc_tree_flags load is satisfied before the push below is visible */
    d_step {
        done = ((tree_flags & PUBLISHED) != 0);
        printf("%d: child %d reads pc_tree_flags (early): %d\n", _pid, me, tree_flags)
    };
#endif
    pc_children_push(me);                           /* parent.addChildLink(ChildLink(me)) */
    pushed[me] = 1;
    if                                              /* count hit a power of two: prune */
    :: me <= NPRUNE -> for_each_linked_child(true, false)
    :: true
    fi;
    kept = 0;
#ifndef BROKEN_DEKKER
    /* if let reason = parent.cancelReasonForDescendants: pc_state(P) is FULFILLED, so
     * pc_tree_flags(P) & CANCEL_PUBLISHED decides */
    d_step {
        done = ((tree_flags & PUBLISHED) != 0);
        printf("%d: child %d reads pc_tree_flags: %d\n", _pid, me, tree_flags)
    };
#endif
    if
    :: done ->
        assert(reason != 0);                        /* the reason is visible */
        sawPublished[me] = 1;
        done = false;
        cancel_child(me, reason)                    /* promise.cancel(reason: reason) */
    :: else ->
        d_step {                                    /* runContinuation: fulfil if free */
            if
            :: cclaim[me] == FREE ->
                assert(!settled[me]);
                cclaim[me] = FULFILLED; settled[me] = 1
            :: else
            fi
        }
    fi
}

#ifdef CLAIM_WINDOW
/* P's handler, after its claim: its ancestor check may find an ancestor's cancel and turn
 * the claim into it; then pc_publish; then, if it turned, passOnClaimedCancel walks with
 * P's own reason. A canceller that forwarded through P before the publish has walked
 * already, with its own: the finding `make verify-claim-window` shows. */
proctype Publisher() {
    REGISTRY_LOCALS;
    byte passed;
    if
    :: d_step { pclaim = CANCELLED; preason = ANCESTOR_REASON;
                printf("%d: P's claim turns into the ancestor's cancel\n", _pid) }
    :: skip
    fi;
    d_step { ppublished = 1; printf("%d: pc_publish(P)\n", _pid) };
    if
    :: pclaim == CANCELLED ->
        passed = preason                            /* passOnClaimedCancel: cancel(reason: own) */
    :: else -> goto published
    fi;
    for_each_linked_child(false, true);
    c = 1;
    do
    :: c <= NCHILD ->
        if
        :: (kept & (1 << c)) != 0 -> cancel_child(c, passed)
        :: else
        fi;
        c++
    :: else -> break
    od;
published:
    skip
}
#endif

#define COVERED(c) (!pushed[c] || takenByCanceller[c] || sawPublished[c] || prunerSaw[c])
#define ENDED_CANCELLED(c) (cclaim[c] == CANCELLED || (ctree_flags[c] & CLAIMED) != 0)

init {
    byte c;
    atomic {
        run Canceller(1);
#if NCANCEL > 1
        run Canceller(2);
#endif
#ifdef CLAIM_WINDOW
        /* children linked while P was pending (settled early, or their descendants in
         * flight): their links are in P's registry already, and they wait */
        c = 1;
        do
        :: c <= NCHILD ->
            lnext[c] = children; children = c; pushed[c] = 1; c++
        :: else -> break
        od;
        run Publisher();
#else
        c = 1;
        do
        :: c <= NCHILD -> run Child(c); c++
        :: else -> break
        od;
#endif
        c = 0
    }
    timeout;                            /* every call has returned */
#ifdef CLAIM_WINDOW
    /* the cancel was published, or P ended cancelled before any canceller forwarded */
    assert((tree_flags & PUBLISHED) != 0 || pclaim == CANCELLED);
#else
    assert((tree_flags & PUBLISHED) != 0);  /* the cancel was published */
#endif
    c = 1;
    do
    :: c <= NCHILD ->
        /* no missed link: taken by the canceller, or its pusher saw CANCEL_PUBLISHED (or a
         * pruner that held it did) */
        assert(pushed[c] && COVERED(c));
        /* so the cancel reached the child, which ended cancelled or forwarding it */
        assert(reached[c] && ENDED_CANCELLED(c));
        /* with the reason P passes down: that of the cancel that won the forwarding, or
         * P's own if it ended cancelled */
#ifdef CLAIM_WINDOW
        assert(creason[c] == (pclaim == CANCELLED -> preason : reason));
#else
        assert(creason[c] == reason);
#endif
        c++
    :: else -> break
    od
}

#if NCHILD == 2
#define ALL_REACHED (reached[1] && reached[2])
#elif NCHILD == 3
#define ALL_REACHED (reached[1] && reached[2] && reached[3])
#else
#define ALL_REACHED (reached[1] && reached[2] && reached[3] && reached[4])
#endif
ltl all_reached { <> (ALL_REACHED && _nr_pr <= 1) }

#elif defined(EPOCH)
/* ======================================================================================
 * Model 3 (-DEPOCH): a cancel of a settled ancestor against handlers that are running in
 * no registry, and the forwarding epoch that keeps their check O(1).
 *
 * A chain R -> P -> C: R is a settled root; P's and C's handlers run (in the library:
 * `.immediate`, on the thread that settles R, so in no registry) and each settles its
 * promise with fulfillFromHandler: pc_claim(FREE -> FULFILLED), then
 * cancelReasonFromAncestors (pc_forwarding_epoch, then each ancestor's tree_flags bit and
 * recorded epoch, walking up until an ancestor verified the current epoch or is the
 * root), then publish. C's handler starts once P has published. An unrelated settled
 * promise X exists too.
 *
 * Cancellers (AnyPromise.cancelOne on a settled promise): pc_forwarding_begin,
 * pc_tree_flags_set(CANCEL_PUBLISHED), pc_forwarding_end. One cancels R; one cancels X (it
 * moves the epoch without touching the chain, so C has to walk); with -DCANCEL_P one
 * cancels P itself (claiming it if its handler has not, else forwarding through it).
 *
 * Property: a promise settled by its handler ends fulfilled only if no ancestor carried
 * a cancel (bit or cancelled state) when it claimed; otherwise it ends cancelled. That is
 * the rule "a descendant whose outcome was decided before the cancel keeps it; every
 * other one ends cancelled" (Cancellation.md).
 *
 * Broken variants (each must FAIL):
 *   -DBROKEN_LATE_BEGIN    the canceller opens the epoch after setting the bit
 *   -DBROKEN_ACTIVE_EQUAL  a child trusts an epoch read while a forward is in progress
 *   -DBROKEN_PARENT_ONLY   a child looks at its parent alone, never walks up (the library
 *                          before the epoch: a cancel of R missed C below a settled P)
 * ====================================================================================== */

#define ACTIVE_ONE 1      /* the low "bits": forwards in progress */
#define EPOCH_ONE  4      /* PC_FORWARDING_EPOCH_ONE: at most 3 forwards at once here */
#define QUIET(e)   ((e) % EPOCH_ONE == 0)
#define UNVERIFIED 1      /* AncestorCheck.unverified: active bits set */
#define NOANC      255    /* AncestorCheck.noAncestors */

#define NP 1              /* promise ids: P and C (R is the root, X unrelated) */
#define NC 2

byte G = 0;               /* the forwarding word */
bit  bitR = 0;            /* R.tree_flags & CANCEL_PUBLISHED */
bit  bitP = 0;            /* P.tree_flags & CANCEL_PUBLISHED */
bit  bitX = 0;
byte claimOf[3];          /* claim words of P and C */
bit  published[3];
byte verified[3];         /* verifiedEpoch of P and C */
bit  ancestorCancelAtClaim[3];   /* ghost: an ancestor carried a cancel when it claimed */

/* An ancestor carries a cancel: PUBLISHED bit, or cancelled (P only: R is fulfilled). */
#define P_CARRIES (bitP || (published[NP] && claimOf[NP] == CANCELLED))

inline forward(bitv) {
#ifndef BROKEN_LATE_BEGIN
    G = G + ACTIVE_ONE;                     /* pc_forwarding_begin */
    bitv = 1;                               /* pc_tree_flags_set(CANCEL_PUBLISHED) */
#else
    bitv = 1;                               /* BROKEN: the bit before the epoch opens */
    G = G + ACTIVE_ONE;
#endif
    G = G + EPOCH_ONE - ACTIVE_ONE          /* pc_forwarding_end */
}

proctype CancelR() { forward(bitR) }
proctype CancelX() { forward(bitX) }

/* P.cancel(): settleFailure (FREE -> CANCELLED), or forward through the settled P. */
proctype CancelP() {
    bool won;
    d_step {
        won = (claimOf[NP] == FREE);
        if :: won -> claimOf[NP] = CANCELLED :: else fi
    };
    if
    :: won -> published[NP] = 1
    :: else -> forward(bitP)
    fi
}

/* After the claim: cancelReasonFromAncestors, then publish (cancelled or fulfilled). */
inline check_and_publish(me) {
    e = G;                                  /* pc_forwarding_epoch */
    found = false;
    if
    :: me == NP ->                          /* parent R: a root */
        found = bitR                        /* R.cancelReasonForDescendants */
    :: else ->                              /* parent P */
        found = P_CARRIES;
        if
        :: !found ->
#if defined(BROKEN_PARENT_ONLY)
            skip
#elif !defined(BROKEN_ACTIVE_EQUAL)
            if
            :: QUIET(e) && verified[NP] == e -> skip          /* P verified this epoch */
            :: else -> found = bitR                            /* walk on: R, the root */
            fi
#else
            if
            :: verified[NP] == e -> skip
            :: else -> found = bitR
            fi
#endif
        :: else
        fi
    fi;
    if
    :: found -> claimOf[me] = CANCELLED     /* turnClaimIntoCancel */
    :: else -> verified[me] = (QUIET(e) -> e : UNVERIFIED)
    fi;
    published[me] = 1                       /* pc_publish */
}

proctype Handler(byte me) {
    byte e; bool found, won;
    if
    :: me == NC -> published[NP]            /* C's handler starts once P has published */
    :: else
    fi;
    if
    :: me == NC && claimOf[NP] == CANCELLED ->
        claimOf[NC] = CANCELLED; published[NC] = 1   /* fired by a cancelled parent */
    :: else ->
        d_step {                            /* pc_claim(FREE -> FULFILLED) */
            won = (claimOf[me] == FREE);
            if
            :: won ->
                claimOf[me] = FULFILLED;
                ancestorCancelAtClaim[me] = (bitR || (me == NC && P_CARRIES))
            :: else
            fi
        };
        if
        :: won -> check_and_publish(me)
        :: else                             /* cancelled before its handler claimed */
        fi
    fi
}

init {
    atomic {
        verified[NP] = UNVERIFIED; verified[NC] = UNVERIFIED;
        run CancelR();
        run CancelX();
#ifdef CANCEL_P
        run CancelP();
#endif
        run Handler(NP);
        run Handler(NC)
    }
    timeout;                                /* every call has returned */
    assert(published[NP] && published[NC]);
    /* fulfilled only if no ancestor carried a cancel at the claim */
    assert(claimOf[NP] != FULFILLED || !ancestorCancelAtClaim[NP]);
    assert(claimOf[NC] != FULFILLED || !ancestorCancelAtClaim[NC]);
    /* and a cancel that came after R's descendants settled leaves them fulfilled */
    assert(claimOf[NP] == CANCELLED || claimOf[NP] == FULFILLED);
    assert(G % EPOCH_ONE == 0)              /* every forward ended */
}

#elif defined(CYCLE)
/* ======================================================================================
 * Model 4 (-DCYCLE): promises that lock in to follow each other at the same time, and the
 * cycle check that keeps a ring of them from waiting for ever (AnyPromise.follow and
 * Promise.resolve(with:), through recordFollowee and wouldWaitOnItself in CoreBridge).
 *
 * A ring of NRING promises; Linker(i) makes promise i follow promise i+1 (mod NRING), all
 * at once: pc_claim(FREE -> FOLLOWING), then the followee link is stored and pc_fence
 * runs, then it registers on promise i+1 (its observer stack is no longer empty), then
 * (closesACycle, after another pc_fence) only if its own promise has observers, the walk:
 * from the promise to follow, while it is FOLLOWING with a recorded link, step to its
 * followee; meeting itself, the linker rejects its promise (pc_claim(FOLLOWING ->
 * REJECTED)), which the ring's followers then adopt through the observer protocol
 * (model 1). Nobody waits on a promise without registering on it, so a promise without
 * observers closes no cycle and skips the walk (what makes follow chains built
 * inner-first linear).
 *
 * Property: when every linker is done, some promise of the ring is rejected: the ring
 * can never end with every promise following and none settled.
 *
 * Broken variants (must FAIL):
 *   -DBROKEN_NO_FENCE     the walk's loads (and the observer check) are satisfied before
 *                         the link store and the registration are visible (what StoreLoad
 *                         reordering allows without pc_fence)
 *   -DBROKEN_CHECK_FIRST  the linker reads its own observers before it registers on the
 *                         promise it follows (the order that would skip the walk on both
 *                         sides of a ring closing at once)
 * ====================================================================================== */

#ifndef NRING
#define NRING 3
#endif

byte rclaim[NRING];       /* each promise's claim word */
byte rlink[NRING];        /* its followee link: 0 = none, else followee + 1 */
bit  robserved[NRING];    /* someone registered on it: its observer stack is not empty */

inline walk_ring(start) {
    cur = start;
    do
    :: d_step { rclaim[cur] == FOLLOWING && rlink[cur] != 0 -> next = rlink[cur] - 1 };
       if
       :: next == me -> cycle = true; break
       :: else -> cur = next
       fi
    :: else -> break
    od
}

proctype Linker(byte me) {
    byte cur, next, target;
    bool cycle = false;
    target = (me + 1) % NRING;
    d_step { rclaim[me] == FREE -> rclaim[me] = FOLLOWING };    /* pc_claim(FREE -> FOLLOWING) */
#if defined(BROKEN_NO_FENCE)
    if                                                           /* reads first... */
    :: robserved[me] -> walk_ring(target)
    :: else
    fi;
    rlink[me] = target + 1;                                      /* ...the stores land late */
    robserved[target] = 1;
#elif defined(BROKEN_CHECK_FIRST)
    rlink[me] = target + 1;                                      /* recordFollowee: store, pc_fence */
    if                                                           /* its observers, read */
    :: robserved[me] -> walk_ring(target)                        /* before it registers */
    :: else
    fi;
    robserved[target] = 1;
#else
    rlink[me] = target + 1;                                      /* recordFollowee: store, pc_fence */
    robserved[target] = 1;                                       /* registers on target (pc_observe) */
    if                                                           /* closesACycle: pc_fence, then */
    :: robserved[me] -> walk_ring(target)                        /* only a promise others wait on */
    :: else                                                      /* walks (wouldWaitOnItself) */
    fi;
#endif
    if
    :: cycle ->
        d_step {                                                 /* rejectAsCycle */
            if
            :: rclaim[me] == FOLLOWING -> rclaim[me] = REJECTED
            :: else
            fi
        }
    :: else
    fi
}

init {
    byte i;
    atomic {
        i = 0;
        do
        :: i < NRING -> run Linker(i); i++
        :: else -> break
        od;
        i = 0
    }
    timeout;                                                     /* every linker is done */
    /* some promise of the ring rejected: its followers adopt that (model 1), so none
     * waits for ever */
    assert(rclaim[0] == REJECTED || rclaim[1] == REJECTED
#if NRING > 2
           || rclaim[2] == REJECTED
#endif
    )
}

#endif

#ifdef WALK_MODEL
/* ======================================================================================
 * Model 4b (-DWALK_MODEL): the cycle check's skips through a pending child, and the walk
 * epoch that ends them when the child locks in (WaitWalk.follow, markWalkedThrough,
 * recordFollowee, pc_walk_epoch_advance).
 *
 * H follows C, the pending child of the pending root P. T locks in to follow H while C
 * locks in to follow T, closing the ring T -> H -> C -> T. Each runs the cycle check
 * (both have observers). A walk reads the epoch as it begins, after its own link is
 * stored and fenced. At H it may find a record: the end of H's run (P, reached through
 * C), made in epoch `rtag - 1`, with the first child it went through (C); it takes P in
 * that epoch, and C in any other. At C, pending, it marks C, then looks at C's claim:
 * still free, it goes on to P and records that at H, in its own epoch; else it looks at
 * C again. C, once its claim to follow won, advances the epoch if it is marked, then
 * stores its link and walks.
 *
 * -DPRE_RECORDED: an earlier walk marked C and recorded P at H in epoch 0; else the
 * walkers make the mark and the record themselves.
 *
 * Property: when both are done, T or C is rejected with the cycle.
 *
 * Broken variants (must FAIL):
 *   -DBROKEN_NO_ADVANCE   a marked child that locks in leaves the epoch alone
 *   -DBROKEN_EPOCH_FIRST  a walk reads the epoch before its link is stored
 *   -DBROKEN_LOOK_FIRST   a walk looks at the child's claim before it marks the child
 * ====================================================================================== */

#define WT 0
#define WH 1
#define WC 2
#define WP 3

byte wclaim[4];           /* claim words; H follows C from the start */
byte wlink[4];            /* followee links: 0 = none, else followee + 1 */
bit  wmark;               /* PC_TREE_WALKED_THROUGH on C */
byte wepoch;              /* pc_walk_epoch_word */
byte rend;                /* H's record: its end + 1 (0: none), */
byte rtag;                /* the epoch it holds in + 1 (WaitWalk.recordTag), */
byte rchild;              /* the first child it went through + 1 */

/* The walk of `me` (T or C) from `start`; sets `cycle` if it meets `me`. */
inline walk_through(start) {
    cur = start;
    do
    :: d_step { (wclaim[cur] == FOLLOWING && cur == WH && rend != 0) ->
           if
           :: rtag == e + 1 -> next = rend - 1                   /* the end, in its epoch */
           :: else -> next = rchild - 1                          /* the end of its follow links */
           fi };
       if
       :: next == me -> cycle = true; break
       :: else -> cur = next
       fi
    :: d_step { (wclaim[cur] == FOLLOWING && !(cur == WH && rend != 0) && wlink[cur] != 0) ->
           next = wlink[cur] - 1 };
       if
       :: next == me -> cycle = true; break
       :: else -> cur = next
       fi
    :: atomic { (wclaim[cur] == FOLLOWING && !(cur == WH && rend != 0) && wlink[cur] == 0) -> break }
                                                                 /* its link not stored yet */
    :: atomic { (wclaim[cur] == FREE && cur == WC) ->
#if defined(BROKEN_LOOK_FIRST)
           seenFree = true };                                    /* the look, then the mark */
       wmark = 1;
#else
           wmark = 1 };                                          /* markWalkedThrough: the mark, */
       seenFree = (wclaim[WC] == FREE);                          /* fence, then the look */
#endif
       if
       :: seenFree ->
           d_step { rend = WP + 1; rtag = e + 1; rchild = WC + 1 };  /* records P at H, */
           break                                                 /* through C; P: no cycle */
       :: else                                                   /* locked in: look again */
       fi
    :: atomic { (cur == WP || (cur == WT && wclaim[cur] == FREE)
                 || (wclaim[cur] != FREE && wclaim[cur] != FOLLOWING)) -> break }
                                                                 /* pending, no parent: P, or T
                                                                    not locked in yet; or settled */
    od
}

proctype WalkT() {
    byte cur, next, e;
    byte me = WT;
    bool cycle = false, seenFree;
    d_step { wclaim[WT] == FREE -> wclaim[WT] = FOLLOWING };     /* pc_claim(FREE -> FOLLOWING) */
#if defined(BROKEN_EPOCH_FIRST)
    e = wepoch;
    wlink[WT] = WH + 1;
#else
    wlink[WT] = WH + 1;                                          /* recordFollowee, pc_fence */
    e = wepoch;                                                  /* the walk begins */
#endif
    walk_through(WH);
    if
    :: cycle -> d_step { wclaim[WT] == FOLLOWING -> wclaim[WT] = REJECTED }
    :: else
    fi
}

proctype WalkC() {
    byte cur, next, e;
    byte me = WC;
    bool cycle = false, seenFree;
    d_step { wclaim[WC] == FREE -> wclaim[WC] = FOLLOWING };     /* pc_claim: full barrier */
#if !defined(BROKEN_NO_ADVANCE)
    if
    :: wmark -> wepoch++                                         /* pc_walk_epoch_advance */
    :: else
    fi;
#endif
#if defined(BROKEN_EPOCH_FIRST)
    e = wepoch;
    wlink[WC] = WT + 1;
#else
    wlink[WC] = WT + 1;                                          /* recordFollowee, pc_fence */
    e = wepoch;
#endif
    walk_through(WT);
    if
    :: cycle -> d_step { wclaim[WC] == FOLLOWING -> wclaim[WC] = REJECTED }
    :: else
    fi
}

init {
    atomic {
        wclaim[WH] = FOLLOWING;
        wlink[WH] = WC + 1;
#if defined(PRE_RECORDED)
        wmark = 1;
        rend = WP + 1; rtag = 1; rchild = WC + 1;
#endif
        run WalkT();
        run WalkC()
    }
    timeout;                                                     /* both are done */
    assert(wclaim[WT] == REJECTED || wclaim[WC] == REJECTED)
}

#endif

#ifdef HOLDS
/* ======================================================================================
 * Model 5 (-DHOLDS): the holds words that keep the path of an in-flight descendant alive.
 *
 * Promise 2 (G) is a child of a root, so it counts nothing; promise 1 (P) is G's child and
 * counts holds; promises 0 and 3 are P's children going in flight at the same time. For
 * each of them, Child(c) runs AnyPromise.addHold(SELF) (holdPathWhileInFlight) while
 * Settler(c) publishes it. Who drops SELF is the Dekker pairing of the two sides: the
 * settler reads the SELF hint before pc_publish (publishClaimedOutcome: set, it drops SELF
 * after the publish, publishLeavingFlight) and the holds word after it
 * (pc_holds_after_publish: SELF there, it drops it, leaveFlight); the child, once its SELF
 * is visible, reads the state word (pc_state_after_hold: published, it drops SELF itself).
 * Either side's drop is removeHold(SELF), whose pc_holds_clear_self lets only one of them
 * clear the bit and go on to the parent. `holds[n]` counts units (SELF included: a leaf
 * has no other), `strong[n]` the strong references that holds keep on promise n (retained
 * by the first hold of a child, released by its last). Each d_step is one atomic
 * operation of pc_holds_* or of the state word (full barriers or seq_cst loads in the C
 * code: the model is sequentially consistent).
 *
 * Properties: no hold is ever removed that was not added (pc_holds_remove_one's abort),
 * no strong reference is released that was not taken, SELF is cleared once, and when
 * every process is done, every count is back to zero (so at least one side dropped SELF).
 * ====================================================================================== */

short holds[4];
short strong[4];
bit   selfset[4];
bit   published[4];   /* the state word: pc_publish has run */
byte  selfcleared[4]; /* how many times SELF was cleared (must end at 1) */

/* removeHold(SELF, from: c), either side: pc_holds_clear_self, then, if that cleared the
 * last unit, the parent's hold and the reference it kept. */
inline drop_self(c) {
#ifdef BROKEN_SELF_TEST_THEN_CLEAR
    d_step { cleared = selfset[c] };                   /* looks, then clears: not one step */
    if
    :: cleared -> d_step { selfset[c] = 0; before = holds[c]; holds[c]-- }
    :: else
    fi;
#else
    d_step {
        if
        :: selfset[c] -> selfset[c] = 0; before = holds[c]; holds[c]--; cleared = 1
        :: else -> cleared = 0
        fi
    };
#endif
    if
    :: cleared ->
        selfcleared[c]++;
        assert(before >= 1);
        if
        :: before == 1 ->                              /* the last hold: up */
            remove_one_at_parent();
            strong[1]--; assert(strong[1] >= 0)
        :: else
        fi
    :: else
    fi
}

/* removeHold(ONE, from: P): P's last hold lets G go (G counts nothing). */
inline remove_one_at_parent() {
    d_step { b1 = holds[1]; holds[1]--; };
    assert(b1 >= 1);                                   /* pc_holds_remove_one's check */
    if
    :: b1 == 1 -> strong[2]--; assert(strong[2] >= 0)
    :: else
    fi
}

proctype Child(byte c) {
    short before, b1;
    bool secured, cleared, seen;
#ifdef BROKEN_BOTTOM_UP
    strong[1]++;                                                 /* parentIfAlive: P, kept */
    d_step { before = holds[c]; holds[c]++; selfset[c] = 1 };   /* the hold, visible first */
    if
    :: before == 0 ->
        d_step { if :: holds[1] != 0 -> holds[1]++; secured = true :: else -> secured = false fi };
        if
        :: !secured ->
            d_step { b1 = holds[1]; holds[1]++ };
            if :: b1 == 0 -> strong[2]++ :: else fi
        :: else
        fi
    :: else -> strong[1]--
    fi
#else
    strong[1]++;                                                 /* parentIfAlive: P, for the walk */
    /* up: pc_holds_add_if_holding on P (P holds already: it counted us at once) */
    d_step { if :: holds[1] != 0 -> holds[1]++; secured = true :: else -> secured = false fi };
    if
    :: !secured ->                                               /* down: P's hold first */
        strong[2]++;                                             /* parentIfAlive: G, for the walk */
        d_step { b1 = holds[1]; holds[1]++ };
        if :: b1 == 0 -> strong[2]++ :: else fi;                 /* P's first hold keeps G */
        strong[2]--; assert(strong[2] >= 0)                      /* the walk lets go of G */
    :: else
    fi;
    d_step { before = holds[c]; holds[c]++; selfset[c] = 1 };   /* then ours, visible */
    if
    :: before == 0 -> strong[1]++                                /* our first hold keeps P */
    :: else -> remove_one_at_parent()                            /* gives back what we added */
    fi;
    strong[1]--; assert(strong[1] >= 0)                          /* the walk lets go of P */
#endif
#ifndef BROKEN_NO_STATE_CHECK
    d_step { seen = published[c] };                              /* pc_state_after_hold */
    if
    :: seen -> drop_self(c)                                      /* settled first: ours to drop */
    :: else
    fi
#endif
}

proctype Settler(byte c) {
    short before, b1;
    bool cleared, hint, seen;
    d_step { hint = selfset[c] };                                /* pc_holds_self_hint */
    d_step { published[c] = 1 };                                 /* pc_publish */
    if
    :: hint -> drop_self(c)                                      /* publishLeavingFlight */
    :: else ->
        d_step { seen = selfset[c] };                            /* pc_holds_after_publish */
        if
        :: seen -> drop_self(c)                                  /* leaveFlight */
        :: else
        fi
    fi
}

init {
    atomic {
        run Child(0); run Settler(0);
        run Child(3); run Settler(3)
    }
    timeout;
    assert(holds[0] == 0 && holds[1] == 0 && holds[3] == 0);
    assert(strong[1] == 0 && strong[2] == 0);
    assert(selfcleared[0] == 1 && selfcleared[3] == 1)
}
#endif

#ifdef GATE
/* ======================================================================================
 * Model 6 (-DGATE): an aggregate's retirement gate (pc_gate_enter, pc_gate_leave), as
 * Aggregator.slotFired drives it. NCB slot callbacks run at once; each enters (one
 * fetch-and-add), and if let in, stores its input in its slot (kept[i]) and runs the
 * policy; callback 0's policy settles the output, so it leaves with a request; the others
 * leave without one, unless they saw the output settled (they may: it is settled from
 * callback 0's policy on). The leaver the gate elects retires: it drops every kept input
 * and the output.
 *
 * The word as in the C code: bit 0 REQUESTED, bit 1 RETIRED, the rest counts callbacks
 * inside (ACTIVE_ONE = 4). Each d_step is one atomic operation (the C code's CAS loop in
 * pc_gate_leave is one atomic step when it succeeds).
 *
 * Properties: exactly one retirement; none while a callback is inside; no callback let in
 * after it (so nothing is kept after the retirement, and nothing the retirer drops is
 * still in use).
 *
 * Broken variant (must FAIL): -DBROKEN_GATE_IGNORES_INSIDE, the leaver retires on a request
 * whatever the count.
 * ====================================================================================== */

#ifndef NCB
#define NCB 3
#endif
#define G_REQUESTED 1
#define G_RETIRED   2
#define G_ONE       4

byte gate;
byte inside;
byte retirements;
bit  outputSettled;
bit  retiredFlag;
bit  keptAfter;

proctype Callback(byte me) {
    bool admitted, request, retire;
    d_step {                                          /* pc_gate_enter */
        admitted = (gate & G_RETIRED) == 0;
        gate = gate + G_ONE
    };
    if
    :: admitted ->
        d_step { inside++; if :: retiredFlag -> keptAfter = 1 :: else fi };   /* slot kept */
        if
        :: me == 0 -> outputSettled = 1               /* the policy settles the output */
        :: else
        fi;
        request = outputSettled;                      /* keptOutput.isPending == false */
        d_step { inside-- }
    :: else -> request = false
    fi;
    d_step {                                          /* pc_gate_leave */
        gate = gate - G_ONE;
        if
        :: request -> gate = gate | G_REQUESTED
        :: else
        fi;
#ifdef BROKEN_GATE_IGNORES_INSIDE
        retire = (gate & G_REQUESTED) != 0 && (gate & G_RETIRED) == 0;
#else
        retire = gate == G_REQUESTED;                 /* nobody inside, asked, not retired */
#endif
        if
        :: retire -> gate = gate | G_RETIRED
        :: else
        fi
    };
    if
    :: retire ->
        d_step {                                      /* Aggregator.retire */
            assert(inside == 0);
            retirements++;
            retiredFlag = 1
        }
    :: else
    fi
}

init {
    byte i;
    atomic {
        i = 0;
        do
        :: i < NCB -> run Callback(i); i++
        :: else -> break
        od
    }
    timeout;
    assert(retirements == 1);
    assert(!keptAfter)
}
#endif

#ifdef REACH_MODEL
/* ======================================================================================
 * Model 7 (-DREACH_MODEL): how far a cancel reaches. The chain R -> A -> B -> L, and a side
 * branch T -> S below L, as in `root.then(.immediate).then(.immediate).then(on: queue)`
 * with a side child T of the leaf L that settled early (a fired `timeout`), whose own
 * child S (a recovery on a queue) goes in flight. R is a settled root its canceller holds;
 * A is settled and held only by the cascade that ran it, which lets it go once L is in
 * flight; B is settled and held by L (`settledParent`) while L's handler waits on a
 * queue that never runs it, so L stays pending unless a cancel reaches it; T is settled and
 * held by S while S's handler waits; S goes in flight, which links T, L, B and A early and
 * holds the path, then settles and lets its hold go.
 *
 * Each operation of the overlay is one atomic step here (the HOLDS and REGISTRY models
 * check their insides): enterFlight = holdPathWhileInFlight (if the promise does not hold
 * its own unit yet) then linkIntoParentChain; a promise's first hold unit keeps its parent
 * (a strong reference) and counts one on it, if the parent is no root; its last unit lets
 * go; a promise whose last strong reference goes dies (its registry link no longer
 * answers); a cancel of a settled promise publishes its reason and forwards to every live
 * linked descendant (a pending one is cancelled); a promise that links itself below one
 * carrying a cancel takes it (addToRegistry's check).
 *
 * Property: when every process is done, L is cancelled.
 *
 * Broken variant (must FAIL): -DBROKEN_HOLD_IF_UNLINKED, enterFlight holds the path only
 * when its own call links the promise (what `linked` meant before): L, linked early by S,
 * never holds B's parent A; S settles and lets its hold go, the cascade lets A go, A dies,
 * and R's cancel finds A's link dead.
 * ====================================================================================== */

#define NR 0
#define NA 1
#define NB 2
#define NL 3
#define NT 4
#define NS 5
#define NNODES 6
#define NONE 255

byte rparent[NNODES];     /* NONE for the root */
byte rrefs[NNODES];       /* strong references */
byte rholds[NNODES];      /* hold units: its own while in flight, one per holding child */
bit  rself[NNODES];       /* its own unit is among them (PC_HOLDS_SELF) */
bit  ralive[NNODES];
bit  rlinked[NNODES];     /* in its parent's registry */
bit  rpublished[NNODES];  /* a cancel forwarded through it after it settled */
byte rstate[NNODES];      /* PENDING, FULFILLED, CANCELLED */
bit  leafInFlight;

#define NOT_ROOT(n) (rparent[n] != NONE)

inline hold(p) {          /* one unit on p; the first keeps p's parent and counts on up */
    cur = p;
    do
    :: rholds[cur] = rholds[cur] + 1;
       if
       :: rholds[cur] == 1 && NOT_ROOT(cur) && NOT_ROOT(rparent[cur]) && ralive[rparent[cur]] ->
          rrefs[rparent[cur]] = rrefs[rparent[cur]] + 1;
          cur = rparent[cur]
       :: else -> break
       fi
    od
}

inline unhold(p) {        /* one unit off p; the last lets the parent go, and on up */
    cur = p;
    do
    :: rholds[cur] = rholds[cur] - 1;
       if
       :: rholds[cur] == 0 && NOT_ROOT(cur) && NOT_ROOT(rparent[cur]) && rrefs[rparent[cur]] > 0 ->
          next = rparent[cur];
          rrefs[next] = rrefs[next] - 1;
          if :: rrefs[next] == 0 -> ralive[next] = 0 :: else fi;
          cur = next
       :: else -> break
       fi
    od
}

#define CARRIES(n) (rpublished[n] || rstate[n] == CANCELLED)

inline forward_down() {   /* every live linked promise under one carrying a cancel gets it:
                             a pending one is cancelled, a settled one forwards (cancelOne) */
    changed = 1;
    do
    :: changed ->
       changed = 0;
       n = 1;
       do
       :: n < NNODES ->
          if
          :: ralive[n] && rlinked[n] && CARRIES(rparent[n]) && !CARRIES(n) ->
             if :: rstate[n] == PENDING -> rstate[n] = CANCELLED :: else -> rpublished[n] = 1 fi;
             changed = 1
          :: else
          fi;
          n++
       :: else -> break
       od
    :: else -> break
    od
}

inline link(p) {          /* linkIntoParentChain: p and its unlinked ancestors, once each;
                             addToRegistry applies a cancel its parent already carries */
    cur = p;
    do
    :: !rlinked[cur] && NOT_ROOT(cur) && ralive[rparent[cur]] ->
       rlinked[cur] = 1;
       cur = rparent[cur]
    :: else -> break
    od;
    forward_down()
}

inline enter_flight(p, linkedBefore) {
#ifdef BROKEN_HOLD_IF_UNLINKED
    if :: !linkedBefore -> rself[p] = 1; hold(p) :: else fi;
#else
    if :: !rself[p] -> rself[p] = 1; hold(p) :: else fi;   /* its own unit, linked or not */
#endif
    link(p)
}

inline drop(p) {          /* a strong reference goes */
    rrefs[p] = rrefs[p] - 1;
    if :: rrefs[p] == 0 -> ralive[p] = 0 :: else fi
}

proctype Side() {         /* S: in flight below the settled T, then settled */
    byte cur, next, n;
    bit changed;
    d_step { enter_flight(NS, rlinked[NS]) };
    d_step {
        if :: rstate[NS] == PENDING -> rstate[NS] = FULFILLED :: else fi;
        rself[NS] = 0;    /* publishClaimedOutcome drops its own unit */
        unhold(NS);
        drop(NT)          /* S's handler ran: it lets its parent go */
    }
}

proctype Leaf() {         /* L: B fires it; its handler is queued for ever */
    byte cur, next, n;
    bit changed;
    d_step { enter_flight(NL, rlinked[NL]); leafInFlight = 1 }
}

proctype Cascade() {      /* lets A go once B has fired L */
    leafInFlight;
    d_step { drop(NA) }
}

proctype Canceller() {    /* R.cancel(): R settled, so it forwards through its registry */
    byte n;
    bit changed;
    d_step {
        rpublished[NR] = 1;
        forward_down()
    }
}

init {
    atomic {
        rparent[NR] = NONE; rparent[NA] = NR; rparent[NB] = NA; rparent[NL] = NB;
        rparent[NT] = NL; rparent[NS] = NT;
        rstate[NR] = FULFILLED; rstate[NA] = FULFILLED; rstate[NB] = FULFILLED;
        rstate[NL] = PENDING; rstate[NT] = REJECTED; rstate[NS] = PENDING;
        ralive[NR] = 1; ralive[NA] = 1; ralive[NB] = 1; ralive[NL] = 1; ralive[NT] = 1; ralive[NS] = 1;
        /* R: its canceller; A: the cascade; B: L's settledParent; L, S: their queues;
           T: S's settledParent (and L's observer stack no more: T settled early) */
        rrefs[NR] = 1; rrefs[NA] = 1; rrefs[NB] = 1; rrefs[NL] = 1; rrefs[NT] = 1; rrefs[NS] = 1;
        run Side(); run Leaf(); run Cascade(); run Canceller()
    }
    timeout;
    assert(rstate[NL] == CANCELLED)
}
#endif

#ifdef PRUNE
/* ======================================================================================
 * Model 9 (-DPRUNE): observers that gave up leave a pending promise (pc_prune), against
 * registrations and a publisher that meets a prune in progress.
 *
 * One promise. Registrar A pushes node 1 then node 2, B node 3, C node 4 (pc_observe);
 * nodes 2 and 3 give up right after their push (the owner's flag that the prune's
 * `gave_up` callback reads). The pruner runs pc_prune twice: take the stack (the word
 * becomes PENDING|FIRING), decide which nodes gave up, put the rest back below the nodes
 * pushed meanwhile (one CAS), then release the dropped ones. One settler (its claim won)
 * runs pc_publish: finding a prune in progress it waits until the nodes are back
 * (pc_wait_for_pruner), then takes and fires them itself.
 *
 * Properties: a node fires at most once, never once dropped, and always on the
 * publisher's thread or (registered after the settle) its registrar's, never the pruner's;
 * a node is dropped at most once, and only if it gave up; the nodes fired by the
 * publisher fire in the order they were pushed; a node that fires itself in pc_observe
 * does so after every pushed node fired or was dropped; at the end every node fired or
 * was dropped (none lost), and the word is the bare outcome.
 *
 * Broken variants (each must FAIL):
 *   -DBROKEN_PRUNE_ON_TOP          the pruner puts its kept nodes back above those pushed
 *                                  meanwhile (the newer ones would fire first);
 *   -DBROKEN_PRUNE_NO_WAIT         the publisher takes the word as if no prune held nodes;
 *   -DBROKEN_PRUNE_PLAIN_PUT_BACK  the pruner writes its nodes back with a plain store of the
 *                                  word it read, not a CAS (a node pushed meanwhile is lost).
 * ====================================================================================== */

#define NNODES 4
#define PRUNER_PID 4              /* _pid of the Pruner: init 0, registrars 1-3 */

byte state = 0;              /* pc_promise.state: observer stack head | FIRING | outcome */
byte nxt[NNODES + 1];        /* pc_node.next */
bit  gaveUp[NNODES + 1];     /* the owner's flag, read by gave_up() */

/* Ghost state, for the properties only. */
bit  fired[NNODES + 1];
bit  dropped[NNODES + 1];    /* off the stack: the put-back left it out */
bit  released[NNODES + 1];   /* handed to `release` */
byte pushOrder[NNODES + 1];  /* position of n among the successful pushes (0: never pushed) */
byte pushCount = 0;
byte lastFiredOrder = 0;     /* pushOrder of the last pushed node fired */

#define DONE(k) (pushOrder[k] == 0 || fired[k] || dropped[k])

/* node->fire(node, promise) from pc_fire_in_order, on the publisher's thread. */
/* The nodes in the pruner's `drops` list are off the stack once the put-back is done. */
inline mark_dropped() {
    n = drops;
    do
    :: n != 0 -> assert(!fired[n] && !dropped[n] && gaveUp[n]); dropped[n] = 1; n = nxt[n]
    :: else -> break
    od;
    n = 0
}

inline fire_pushed(n) {
    d_step {
        assert(!fired[n] && !dropped[n]);               /* once, never after a drop */
        assert((state & OUTCOME_MASK) == FULFILLED);    /* after the outcome is in the word */
        assert(pushOrder[n] > lastFiredOrder);          /* in push (registration) order */
        assert(_pid != PRUNER_PID);                     /* never on the pruner's thread */
        printf("%d: fires pushed node %d\n", _pid, n);
        lastFiredOrder = pushOrder[n];
        fired[n] = 1
    }
}

/* pc_fire_in_order(stack, promise): reverse the (private) stack, fire each node. */
inline fire_in_order(stack) {
    d_step {
        ordered = 0;
        do
        :: stack != 0 -> n = nxt[stack]; nxt[stack] = ordered; ordered = stack; stack = n
        :: else -> break
        od;
        n = 0
    };
    do
    :: ordered != 0 -> n = ordered; nx = nxt[n]; fire_pushed(n); ordered = nx
    :: else -> break
    od
}

/* void pc_observe(pc_promise *promise, pc_node *node), CPromiseCore.c */
inline observe(node) {
    seen = state;
    do
    :: (seen & OUTCOME_MASK) != PENDING && (seen & FIRING) == 0 ->
        d_step {                                  /* settled and quiescent: fire itself */
            assert(!fired[node] && !dropped[node]);
            assert(DONE(1) && DONE(2) && DONE(3) && DONE(4));   /* after every pushed node */
            fired[node] = 1
        };
        break
    :: else ->
        d_step {                                  /* CAS push, keeping the tag bits */
            if
            :: state == seen ->
                nxt[node] = HEAD(seen);
                state = WORD(node, seen & TAG_MASK);
                pushCount++;
                pushOrder[node] = pushCount;
                ok = true
            :: else -> seen = state; ok = false
            fi
        };
        if
        :: ok -> break
        :: else
        fi
    od
}

proctype Registrar(byte first; byte count; byte givesUp) {
    byte seen, node;
    bool ok;
    node = first;
    do
    :: node < first + count ->
        observe(node);
        if
        :: node == givesUp -> gaveUp[node] = 1    /* its owner stops caring */
        :: else
        fi;
        node++
    :: else -> break
    od
}

/* void pc_publish(pc_promise *promise): the claim was won and the value stored. */
proctype Settler() {
    byte seen, stack, nextw, ordered, n, nx;
    bool ok;
    seen = state;
    assert((seen & OUTCOME_MASK) == PENDING);     /* pc_die: published twice */
    do
#ifndef BROKEN_PRUNE_NO_WAIT
    :: (seen & TAG_MASK) == FIRING ->             /* pc_wait_for_pruner */
        (state & TAG_MASK) != FIRING;
        seen = state
#endif
    :: else ->
        stack = HEAD(seen);
        nextw = (stack != 0 -> (FULFILLED | FIRING) : FULFILLED);
        d_step {
            if
            :: state == seen -> state = nextw; ok = true
            :: else -> seen = state; ok = false
            fi
        };
        if
        :: !ok -> skip
        :: ok && stack == 0 -> break              /* quiescent */
        :: ok && stack != 0 -> fire_in_order(stack); seen = nextw
        fi
    od
}

/* bool pc_prune(promise, gave_up, release, context, &kept), CPromiseCore.c, twice. */
proctype Pruner() {
    byte seen, taken, kept, keptTail, drops, head, tail, n, nx, rounds;
    bool ok;
    do
    :: rounds < 2 ->
        rounds++;
        ok = false;
        seen = state;
        do
        :: (seen & TAG_MASK) != PENDING -> break  /* settled, firing: return false */
        :: seen == PENDING -> break               /* nothing registered */
        :: else ->
            d_step {                              /* CAS seen -> PENDING|FIRING */
                if
                :: state == seen -> state = FIRING; taken = HEAD(seen); ok = true
                :: else -> seen = state
                fi
            };
            if
            :: ok -> break
            :: else
            fi
        od;
        if
        :: ok ->
            /* split, newest first, keeping the order; `gave_up` only looks */
            kept = 0; keptTail = 0; drops = 0; n = taken;
            do
            :: n != 0 ->
                nx = nxt[n];
                d_step {
                    if
                    :: gaveUp[n] -> nxt[n] = drops; drops = n
                    :: else ->
                        if
                        :: kept == 0 -> kept = n
                        :: else -> nxt[keptTail] = n
                        fi;
                        keptTail = n
                    fi
                };
                n = nx
            :: else -> break
            od;
            if
            :: keptTail != 0 -> nxt[keptTail] = 0
            :: else
            fi;
            /* put the kept nodes back below those pushed meanwhile */
            seen = state;
            do
            :: d_step {                           /* private: only registrations move the word */
                   assert((seen & TAG_MASK) == FIRING);   /* pc_die: changed under the pruner */
                   head = HEAD(seen);
                   if
                   :: head == 0 -> head = kept
                   :: else ->
#ifdef BROKEN_PRUNE_ON_TOP
                       if
                       :: kept != 0 -> nxt[keptTail] = head; head = kept
                       :: else
                       fi
#else
                       tail = head;
                       do
                       :: nxt[tail] != 0 && nxt[tail] != kept -> tail = nxt[tail]
                       :: else -> break
                       od;
                       nxt[tail] = kept
#endif
                   fi
               };
#ifdef BROKEN_PRUNE_PLAIN_PUT_BACK
               d_step { state = WORD(head, PENDING); mark_dropped() };   /* a plain store */
               break
#else
               d_step {
                   if
                   :: state == seen -> state = WORD(head, PENDING); mark_dropped(); ok = true
                   :: else -> seen = state; ok = false
                   fi
               };
               if
               :: ok -> break
               :: else
               fi
#endif
            od;
            /* release the dropped nodes, once the stack is back */
            do
            :: drops != 0 ->
                n = drops; drops = nxt[n];
                d_step {
                    assert(dropped[n] && !fired[n] && !released[n]);
                    released[n] = 1;
                    printf("%d: pc_prune releases node %d\n", _pid, n)
                }
            :: else -> break
            od
        :: else
        fi
    :: else -> break
    od
}

init {
    atomic {
        run Registrar(1, 2, 2);
        run Registrar(3, 1, 3);
        run Registrar(4, 1, 0);
        run Pruner();
        run Settler()
    }
    timeout;
    assert(state == FULFILLED);                   /* the bare outcome: nothing left queued */
    assert(fired[1] || released[1]);
    assert(fired[2] || released[2]);
    assert(fired[3] || released[3]);
    assert(fired[4] || released[4]);
    assert(!dropped[1] && !dropped[4])            /* only nodes that gave up are dropped */
}
#endif

#ifdef CASCADE_MODEL
/* ======================================================================================
 * Model 10 (-DCASCADE_MODEL): a cascade keeps the path its inline handlers look up
 * through. R is a settled root its canceller holds. Two cascades run at once, each on its
 * own thread, each ending with an `.immediate` handler that claims its child's outcome
 * and then looks up (cancelReasonFromAncestors; the epoch has moved, so it walks: each
 * ancestor tried with swift_tryRetain, a dead one ends the walk):
 *
 *   chain:    R -> A -> B -> C. B's handler ran holding A (settledParent) and its
 *             publish fired C inline; B then keeps A until the cascade ends
 *             (keepParentUntilCascadeEnds), C's handler runs, claims, and looks up
 *             through B (held by C) and A. Nobody else holds A.
 *   follower: R -> P -> X -> Z. X followed a promise and was in flight, its holds keeping
 *             P; the followed promise settled on this thread, inside a cascade: X adopts
 *             and publishes, firing Z inline; X keeps its holds until the cascade ends
 *             (publishLeavingFlight), Z's handler runs, claims, and looks up through X
 *             (held by Z) and P. Nobody else holds P.
 *
 * Each overlay operation is one atomic step (other models check their insides); the
 * canceller's R.cancel() publishes R's reason in one step.
 *
 * Property: a handler's child whose claim came after R.cancel() returned ends cancelled.
 *
 * Broken variants (each must FAIL):
 *   -DBROKEN_CHAIN_DROPS_PARENT  B lets A go when its handler is done;
 *   -DBROKEN_FOLLOWER_DROPS_PATH X drops its holds right after its publish (the code before
 *                                this model: A dies before Z looks up).
 * ====================================================================================== */

#define CA 0          /* the chain's A */
#define CP 1          /* the follower's P */
bit  cAlive[2];
byte cRefs[2];
bit  rCarries;        /* R's reason published (CANCEL_PUBLISHED) */
bit  cancelReturned;  /* ghost: R.cancel() has returned */
bit  claimAfterCancel[2];
byte childState[2];   /* C's and Z's outcome */

inline release(n) {
    cRefs[n] = cRefs[n] - 1;
    if :: cRefs[n] == 0 -> cAlive[n] = 0 :: else fi
}

/* The handler's child claims, then walks: its parent (held by it, carrying nothing),
 * then the ancestor n (tried), then R. */
inline claim_and_look_up(n) {
    d_step { claimAfterCancel[n] = cancelReturned };
    d_step {                                  /* swift_tryRetain on the ancestor */
        if :: cAlive[n] -> cRefs[n] = cRefs[n] + 1; got = 1 :: else -> got = 0 fi
    };
    if
    :: got ->
        if :: rCarries -> found = 1 :: else -> found = 0 fi;   /* R, the ancestor's parent */
        d_step { release(n) }
    :: else -> found = 0                      /* a dead ancestor ends the walk */
    fi;
    childState[n] = (found -> CANCELLED : FULFILLED)
}

proctype ChainCascade() {
    bit got, found, kept;
#ifdef BROKEN_CHAIN_DROPS_PARENT
    d_step { release(CA) };                   /* B's handler done: A goes */
#else
    kept = 1;                                 /* B's publish fired C: A kept till the end */
#endif
    claim_and_look_up(CA);
    if :: kept -> d_step { release(CA) } :: else fi   /* the cascade ends */
}

proctype FollowerCascade() {
    bit got, found, kept;
    /* X adopts and publishes, firing Z inline */
#ifdef BROKEN_FOLLOWER_DROPS_PATH
    d_step { release(CP) };                   /* X's holds go at once: P goes */
#else
    kept = 1;                                 /* publishLeavingFlight: kept till the end */
#endif
    claim_and_look_up(CP);
    if :: kept -> d_step { release(CP) } :: else fi
}

proctype CascadeCanceller() {
    rCarries = 1;                             /* R.cancel(): R settled, its reason published */
    cancelReturned = 1
}

init {
    atomic {
        cAlive[CA] = 1; cRefs[CA] = 1;        /* A: B's settledParent */
        cAlive[CP] = 1; cRefs[CP] = 1;        /* P: X's holds */
        run ChainCascade(); run FollowerCascade(); run CascadeCanceller()
    }
    timeout;
    assert(!claimAfterCancel[CA] || childState[CA] == CANCELLED);
    assert(!claimAfterCancel[CP] || childState[CP] == CANCELLED)
}
#endif

#ifdef LIFETIME_MODEL
/* ======================================================================================
 * Model 11 (-DLIFETIME_MODEL): the lifetime model's rules together, checked against the
 * property they exist for: a cancel of any live ancestor reaches every pending descendant,
 * and every reference and hold is released once, when its last user is done.
 *
 *   R -> A -> B -> L     R a root; A = R.then(.immediate); B = A.then(.immediate);
 *             \-> F     L = B.then(on: queue), a queue that runs L's job only at the end;
 *                       F = B.then(.immediate) { _ in Q }: F follows Q (a follow lock),
 *                       a pending root whose work never settles it.
 *
 * Threads: R's resolver fulfils R (at the top, holding R through the cascade, or inside
 * an outer scope, letting R go before the cascade runs), and the cascade runs A's and B's
 * handlers, fires L (which goes in flight: `enterFlight`, its own hold unit, then
 * `linkIntoParentChain`) and runs F's handler (which locks in to follow Q: claim FOLLOWING, record the link, go in
 * flight, register on Q, look up, `forwardCancelIfClaimed`); B's step keeps A until the
 * cascade ends. In some runs B's holder settles B early, while A may still be pending
 * (a side branch settled early, as `timeout` does): then that thread fires L and F, and
 * their links go into A's registry while A is pending, and into R's; and B, below a
 * pending A, links itself up and leaves A's list (`leavePendingParent`: a prune takes
 * its node once its walk is done, so A's fire may never see B). The canceller holds
 * one of R, A or B (each a separate run) and cancels it: a pending promise takes the
 * cancel and fires its observers with it; a settled one publishes the reason and forwards
 * through its registry; a follower forwards to its followee; a promise that links itself
 * below one that carries a cancel takes it (`addToRegistry`'s check). Walks try each
 * promise (`swift_tryRetain`): a dead one answers nothing. A promise's first hold unit
 * keeps its parent (if neither is a root) and counts one there; the last lets go.
 *
 * Each overlay operation is one atomic step (the REGISTRY, EPOCH, HOLDS and CASCADE models
 * check their insides); the cancel's walk is one step per promise, so links, deaths and
 * settles interleave with it.
 *
 * Properties: at the end, L and F are cancelled, and so is Q once F's handler returned it;
 * no reference or hold unit is released that was not taken; once L's queue has run and Q's
 * work has let Q go, every promise is dead, with no hold left.
 *
 * Broken variants (each must FAIL):
 *   -DBROKEN_NO_REAPPLY          a link pushed into a registry whose cancel walked already
 *                                does not take the cancel;
 *   -DBROKEN_FOLLOW_SKIPS_FLIGHT a follower locks in without going in flight;
 *   -DBROKEN_NO_FOLLOWEE_CANCEL  a cancelled follower does not forward to its followee;
 *   -DBROKEN_NO_PATH_HOLD        a promise in flight holds nothing above it;
 *   -DBROKEN_SELF_KEPT           a promise in flight keeps its hold unit once settled;
 *   -DBROKEN_SETTLE_DROPS_PARENT a derived promise settled by its holder keeps nothing above
 *                                it while its children go in flight (the library before
 *                                this model: A dies before L's or F's hold reaches it);
 *   -DBROKEN_KEEP_AFTER_CLAIM    it keeps its parent only from after its claim (found by the
 *                                stress test of this case: A runs, finds B claimed, and dies
 *                                before B's publish keeps it);
 *   -DBROKEN_ROOT_NOT_KEPT       A's step lets its root parent go when its handler is done
 *                                (the library before this model: R settled inside an outer
 *                                scope, cancelled and let go before B looks up);
 *   -DBROKEN_LINK_STOPS_AT_LINKED a link walk that finds its promise linked stops there,
 *                                leaving the parent unlinked (the library before: found with
 *                                B on a queue, settled early, its walk paused);
 *   -DBROKEN_IN_FLIGHT_KEEPS_NOTHING a holder's settle of a promise in flight keeps nothing,
 *                                counting on its own hold, which the thread putting it in
 *                                flight drops at once when it sees it settled (found here);
 *   -DBROKEN_EARLY_CHILD_UNLINKED a parent that fires a child settled early does not link
 *                                it (the library before this model: R's cancel is lost when
 *                                R dies before the link walk of L, below B, reaches A);
 *   -DBROKEN_CARRIER_SKIPS_REGISTRY a cancel that reaches a promise carrying one already
 *                                (cancelled by its claim's look-up) does not walk its
 *                                registry: A then misses B, which left its list, and L.
 *
 * The rules these last variants remove were found by this model, its stress test and a
 * review, and a test in LifetimeModelTests shows each gap on the library without them:
 *   - a derived promise settled by its holder keeps its parent from before its claim until
 *     the cascade of its publish ends (`publishKeepingParent`);
 *   - a parent that fires a child and finds it settled already links the child and itself
 *     up its chain, while its own parent is held (`linkIntoParentChain`, which links the
 *     parent of a child linked already);
 *   - a step whose publish fired inline children keeps its parent till the cascade ends,
 *     a root too (`keepParentUntilCascadeEnds`).
 * ====================================================================================== */

#define LR 0
#define LA 1
#define LB 2
#define LL 3
#define LF 4
#define LQ 5
#define LN 6
#define LNONE 255
#define BIT(n) (1 << (n))

byte lparent[LN];     /* LNONE for a root */
byte lrefs[LN];       /* strong references */
bit  lalive[LN];
byte lstate[LN];      /* PENDING, FULFILLED, CANCELLED */
bit  lfollowing[LN];  /* claim FOLLOWING (F), still pending */
bit  lfired[LN];      /* out of its parent's observer list */
byte lrelease[LN];    /* references the cancel holds on it (a fired node's, a walk's) */
byte lholds[LN];      /* hold units */
bit  lself[LN];       /* its own unit is among them (PC_HOLDS_SELF) */
bit  ltook[LN];       /* its units keep its parent (a reference and one unit there) */
bit  llinked[LN];     /* in its parent's registry */
bit  lpublished[LN];  /* a cancel forwarded through it after it settled */
bit  lrecorded;       /* F's followee link is recorded */
bit  lobserving;      /* Q's observer list holds F's node */
bit  lqOwned;         /* ghost: F's handler returned Q, which F now owns */
bit  lqueued;         /* L's job is on its queue (holding L, and B for L's handler) */
bit  lclaimed;        /* B's holder won B's claim (its publish may not have come yet) */
bit  bQueued;         /* B = A.then(on: queue) in this run, not A.then(.immediate) */
bit  lbJob;           /* B's job is on its queue (holding B, and A for B's handler) */
bit  lleft;          /* B, settled early below a pending A, walked its links up: its
                        node may leave A's list (PC_TREE_LEFT_PARENT) */
byte target;

#define LNOT_ROOT(n) (lparent[n] != LNONE)
#define LCARRIES(n)  (lpublished[n] || lstate[n] == CANCELLED)

inline ldrop(n) {         /* a strong reference goes; the last one kills */
    assert(lrefs[n] > 0);
    lrefs[n] = lrefs[n] - 1;
    if :: lrefs[n] == 0 -> lalive[n] = 0; assert(!lself[n]) :: else fi
}

inline lhold(p) {         /* one unit on p; a first unit keeps p's parent and counts on up */
    cur = p;
    do
    :: lholds[cur] = lholds[cur] + 1;
       if
       :: lholds[cur] == 1 && LNOT_ROOT(cur) && LNOT_ROOT(lparent[cur]) && lalive[lparent[cur]] ->
          ltook[cur] = 1;
          lrefs[lparent[cur]] = lrefs[lparent[cur]] + 1;
          cur = lparent[cur]
       :: else -> break
       fi
    od
}

inline lunhold(p) {       /* one unit off p; the last lets the parent go (after its count) */
    cur = p;
    byHold = 0;
    do
    :: assert(lholds[cur] > 0);
       lholds[cur] = lholds[cur] - 1;
       if
       :: lholds[cur] == 0 && ltook[cur] -> ltook[cur] = 0; next = lparent[cur]
       :: else -> next = LNONE
       fi;
       if :: byHold -> ldrop(cur) :: else fi;
       if :: next != LNONE -> cur = next; byHold = 1 :: else -> break fi
    od
}

inline ldrop_self(n) {    /* dropSelfHold: whoever clears the bit drops the unit */
    if :: lself[n] -> lself[n] = 0; lunhold(n) :: else fi
}

inline lpublish_self_hold(n) {   /* publishClaimedOutcome's part */
#ifndef BROKEN_SELF_KEPT
    ldrop_self(n)
#else
    skip
#endif
}

/* One promise's turn in a cancel: `todo` holds the promises still to reach. */
inline lcancel_one(n) {
    if
    :: !lalive[n] -> skip                               /* its try-retain fails */
    :: lalive[n] && lstate[n] == PENDING && !(n == LB && lclaimed) ->
       lstate[n] = CANCELLED;                           /* claims over FREE or FOLLOWING */
       lpublish_self_hold(n);
       c = 0;
       do
       :: c < LN ->
          if
          :: lparent[c] == n && !lfired[c] -> lfired[c] = 1; lrelease[c]++; todo = todo | BIT(c)
          :: lparent[c] == n && lfired[c] && llinked[c] && lalive[c] ->
             lrefs[c]++; lrelease[c]++; todo = todo | BIT(c)           /* tried and held */
          :: else
          fi;
          c++
       :: else -> break
       od;
#ifndef BROKEN_NO_FOLLOWEE_CANCEL
       if :: n == LF && lrecorded -> todo = todo | BIT(LQ) :: else fi;
#endif
       if :: n == LQ && lobserving -> lobserving = 0; lrelease[LF]++; todo = todo | BIT(LF) :: else fi
    :: lalive[n] && (lstate[n] != PENDING || (n == LB && lclaimed)) && !LCARRIES(n) ->
       lpublished[n] = 1;                               /* CANCEL_PUBLISHED, then its registry */
       c = 0;
       do
       :: c < LN ->
          if
          :: lparent[c] == n && llinked[c] && lalive[c] -> lrefs[c]++; lrelease[c]++; todo = todo | BIT(c)
          :: else
          fi;
          c++
       :: else -> break
       od
    :: else ->
       /* Carries it already (cancelled by its claim's look-up, say): its registry is
        * still walked (cancelOne's forEachLinkedChild runs whatever the claim did), which
        * is how children that left its list while it was pending take the cancel
        * (-DBROKEN_CARRIER_SKIPS_REGISTRY: not walked). */
#ifndef BROKEN_CARRIER_SKIPS_REGISTRY
       c = 0;
       do
       :: c < LN ->
          if
          :: lalive[n] && lparent[c] == n && llinked[c] && lalive[c] -> lrefs[c]++; lrelease[c]++; todo = todo | BIT(c)
          :: else
          fi;
          c++
       :: else -> break
       od
#else
       skip
#endif
    fi;
    do :: lrelease[n] > 0 -> lrelease[n]--; ldrop(n) :: else -> break od;
    skip
}

inline ldrain() {
    do
    :: todo != 0 ->
       d_step {
           n = 0;
           do :: todo & BIT(n) -> break :: else -> n++ od;
           todo = todo & (255 - BIT(n));
           lcancel_one(n)
       }
    :: else -> break
    od;
    skip                  /* a break may not land on a d_step that follows */
}

/* cancelReasonFromAncestors, as one step: up from p through live promises, pending ones
 * too. (Stopping at a pending one is not caught here: F and L also link, and the links
 * reach them. LifetimeModelTests has the case that needs it, a child that only claims.) */
inline llookup(p) {
    found = 0;
    cur = p;
    do
    :: cur == LNONE -> break
    :: cur != LNONE ->
       if
       :: !lalive[cur] -> break
       :: else ->
          if :: LCARRIES(cur) -> found = 1; break :: else -> cur = lparent[cur] fi
       fi
    od
}

/* linkIntoParentChain: p into its parent's registry (unless linked already), then each
 * unlinked ancestor into its own, while the parent is alive; addToRegistry takes a cancel
 * its parent carries. A linked p still has its parent linked: a descendant's walk may
 * have linked p and not reached its parent yet (-DBROKEN_LINK_STOPS_AT_LINKED: it stops). */
inline llink(p) {
    link = p;
#ifdef BROKEN_LINK_STOPS_AT_LINKED
    if :: llinked[p] -> link = LNONE :: else fi;
#endif
    do
    :: link == LNONE -> break
    :: link != LNONE ->
       d_step {
           if
           :: !llinked[link] && LNOT_ROOT(link) && lalive[lparent[link]] ->
              llinked[link] = 1;
#ifndef BROKEN_NO_REAPPLY
              if :: LCARRIES(lparent[link]) -> lrefs[link]++; lrelease[link]++; todo = todo | BIT(link) :: else fi;
#endif
              if :: LNOT_ROOT(lparent[link]) -> link = lparent[link] :: else -> link = LNONE fi
           :: link == p && llinked[link] && LNOT_ROOT(link) && LNOT_ROOT(lparent[link]) ->
              link = lparent[link]                     /* p linked already: on to its parent */
           :: else -> link = LNONE
           fi
       }
    od;
    ldrain()
}

inline lenter_flight(p) {
#ifndef BROKEN_NO_PATH_HOLD
    d_step { if :: !lself[p] -> lself[p] = 1; lhold(p) :: else fi };
    d_step { if :: lstate[p] != PENDING -> ldrop_self(p) :: else fi };
#endif
    llink(p)
}

/* B's publish fired L, whose handler goes to its queue (sourceDidSettle); B settled
 * without a cancel, and L keeps B for its handler (settledParent, taken at the fire). */
inline lfire_queued() {
    d_step { carried = LCARRIES(LB) };
    if
    :: !carried ->
       lenter_flight(LL);
       d_step { carried = LCARRIES(LB) }             /* a cancel arrived while we linked */
    :: else
    fi;
    if
    :: carried -> d_step { todo = todo | BIT(LL); lrelease[LL]++ }; ldrain(); d_step { ldrop(LB) }
    :: else -> lqueued = 1
    fi
}

/* F's deferred handler: it returns Q, and F locks in to follow it. F keeps B meanwhile. */
inline lrun_follower() {
    d_step { carried = LCARRIES(LB) };
    if
    :: carried -> d_step { todo = todo | BIT(LF) }; ldrain()
    :: else ->
       d_step {
           lqOwned = 1;
           if :: lstate[LF] == PENDING && !lfollowing[LF] -> lfollowing[LF] = 1; ok = 1 :: else -> ok = 0 fi
       };
       if
       :: ok ->
          d_step { lrecorded = 1 };
#ifndef BROKEN_FOLLOW_SKIPS_FLIGHT
          lenter_flight(LF);
#endif
          d_step { lobserving = 1; lrefs[LF] = lrefs[LF] + 1 };   /* registered on Q */
          d_step {
              llookup(LB);
              if
              :: found -> todo = todo | BIT(LF)
              :: !found && lstate[LF] == CANCELLED -> todo = todo | BIT(LQ)   /* forwardCancelIfClaimed */
              :: else
              fi
          };
          ldrain()
       :: else ->
          d_step { if :: lstate[LF] == CANCELLED -> todo = todo | BIT(LQ) :: else fi };
          ldrain()
       fi
    fi;
    d_step { ldrop(LB) };  /* its handler is done, and it followed: nothing kept */
    d_step { ldrop(LF) }   /* B's observer list's node */
}

/* A promise's publish takes its observer list: B's fires L and F. */
inline lfire_children_of_B(cancelled) {
    if
    :: !lfired[LL] ->
       lfired[LL] = 1; lfired[LF] = 1;
       if
       :: cancelled -> lrelease[LL]++; lrelease[LF]++; todo = todo | BIT(LL) | BIT(LF); firedLF = 0
       :: else -> lrefs[LB] = lrefs[LB] + 2; firedLF = 1   /* L and F keep B */
       fi
    :: else -> firedLF = 0
    fi
}

proctype LRootSettler() {
    byte todo, n, c, cur, next, link;
    bit carried, found, byHold, settled, firedB, firedLF, keepA, keepR, ok, nested;
    /* Outermost, R's resolver holds R through the cascade; nested in an outer scope, its
     * settling call returns (and its caller may let R go) before the cascade runs. */
    if :: nested = 1 :: nested = 0 fi;
    d_step {
        if
        :: lstate[LR] == PENDING ->
           lstate[LR] = FULFILLED; lfired[LA] = 1; lrefs[LR] = lrefs[LR] + 1; settled = 1
        :: else -> settled = 0
        fi
    };
    if :: nested -> d_step { ldrop(LR) } :: else fi;
    if
    :: settled ->
       /* A's deferred run: A keeps R (settledParent) */
       d_step { carried = LCARRIES(LR) };
       if
       :: carried -> d_step { todo = todo | BIT(LA) }; ldrain(); firedB = 0
       :: else ->
          d_step {
              if
              :: lstate[LA] == PENDING ->
                 llookup(LR);
                 lstate[LA] = (found -> CANCELLED : FULFILLED);
                 if
                 :: !lfired[LB] ->
                    lfired[LB] = 1;
                    if
                    :: found -> lrelease[LB]++; todo = todo | BIT(LB); firedB = 0
                    :: else -> lrefs[LA] = lrefs[LA] + 1; firedB = 1   /* B keeps A */
                    fi
                 :: else -> firedB = 0
                 fi
              :: else -> firedB = 0                    /* settled first: runs nothing */
              fi
          };
          ldrain();
          if
          :: firedB && bQueued ->
             /* sourceDidSettle for a queued B, inside A's publish (A's handler holds R) */
             d_step { carried = LCARRIES(LA) };
             if :: !carried -> lenter_flight(LB); d_step { carried = LCARRIES(LA) } :: else fi;
             if
             :: carried -> d_step { todo = todo | BIT(LB); lrelease[LB]++ }; ldrain(); d_step { ldrop(LA) }
             :: else -> lbJob = 1      /* its job holds B (the node's reference), B holds A */
             fi;
             firedB = 0                /* not an inline child: nothing more on this thread */
          :: else
          fi
       fi;
#ifndef BROKEN_ROOT_NOT_KEPT
       /* A's handler is done; its publish fired B inline: A keeps R, a root, till the
        * cascade ends (keepParentUntilCascadeEnds) */
       if :: firedB -> keepR = 1 :: else -> d_step { ldrop(LR) } fi;
#else
       d_step { ldrop(LR) };  /* A's handler is done; R is a root: nothing kept */
#endif
       d_step { ldrop(LA) };  /* R's observer list's node */
       if
       :: firedB ->
          /* B's deferred run */
          d_step { carried = LCARRIES(LA) };
          if
          :: carried -> d_step { todo = todo | BIT(LB) }; ldrain(); d_step { ldrop(LA); ldrop(LB) }
          :: else ->
             d_step {
                 if
                 :: lstate[LB] == PENDING && !lclaimed ->
                    llookup(LA);
                    lstate[LB] = (found -> CANCELLED : FULFILLED);
                    lfire_children_of_B(found)
                 :: else -> firedLF = 0                 /* settled (or claimed) by its holder */
                 fi
             };
             ldrain();
#ifndef BROKEN_EARLY_CHILD_UNLINKED
             /* Settled early: its descendants in flight may still be linking up, and A's
              * parent can die before their walk reaches it. So B and A are linked now,
              * while A's parent is held (here by R's resolver, or A's cascade keep):
              * runContinuation's linkIntoParentChain. */
             if :: !firedLF && lstate[LB] != CANCELLED -> llink(LB) :: else fi;
#endif
             if
             :: firedLF ->
                lfire_queued();
                keepA = 1      /* B's publish fired F inline: B keeps A till the cascade ends */
             :: else -> d_step { ldrop(LA) }
             fi;
             d_step { ldrop(LB) };                      /* A's observer list's node */
             if :: firedLF -> lrun_follower() :: else fi;
             if :: keepA -> d_step { ldrop(LA) } :: else fi   /* the cascade ends */
          fi
       :: else
       fi;
       if :: keepR -> d_step { ldrop(LR) } :: else fi
    :: else
    fi;
    if :: !nested -> d_step { ldrop(LR) } :: else fi   /* R's resolver lets it go */
}

proctype LSideSettler() {      /* B's holder fulfils B early: claim, then publish */
    byte todo, n, c, cur, next, link;
    bit carried, found, byHold, firedLF, ok, keptA, keepSelf;
#ifndef BROKEN_SETTLE_DROPS_PARENT
    /* A derived promise settled by its holder keeps its parent (if alive) from before its
     * claim until the cascade of its publish ends, as a handler's step does:
     * publishKeepingParent. (-DBROKEN_KEEP_AFTER_CLAIM: from after the claim.) */
#ifndef BROKEN_KEEP_AFTER_CLAIM
    /* Even in flight: its own hold may go at once, dropped by the thread putting it in
     * flight when that thread sees it settled (-DBROKEN_IN_FLIGHT_KEEPS_NOTHING: skipped). */
#ifndef BROKEN_IN_FLIGHT_KEEPS_NOTHING
    d_step { if :: lalive[LA] -> lrefs[LA]++; keptA = 1 :: else fi };
#else
    d_step { if :: lalive[LA] && !lself[LB] -> lrefs[LA]++; keptA = 1 :: else fi };
#endif
#endif
#endif
    d_step {
        if :: lstate[LB] == PENDING && !lclaimed -> lclaimed = 1; ok = 1 :: else -> ok = 0 fi
    };
#if !defined(BROKEN_SETTLE_DROPS_PARENT) && defined(BROKEN_KEEP_AFTER_CLAIM)
    d_step { if :: ok && lalive[LA] -> lrefs[LA]++; keptA = 1 :: else fi };
#endif
    if
    :: ok ->
       /* in flight: publishLeavingFlight keeps its own hold till its cascade is over */
       d_step { lstate[LB] = FULFILLED; keepSelf = lself[LB]; lfire_children_of_B(0) };
       ldrain();
       if :: firedLF -> lfire_queued(); lrun_follower() :: else fi;
       if :: keepSelf -> d_step { ldrop_self(LB) } :: else fi;
       /* leavePendingParent: below a pending A, B links itself and A up, then marks the
        * walk done, after which a prune may take its node off A's list (LPruner), so
        * A's fire never sees B. */
       d_step { carried = (lstate[LA] == PENDING && lalive[LA]) };
       if
       :: carried -> llink(LB); d_step { lleft = 1 }
       :: else
       fi
    :: else
    fi;
    if :: keptA -> d_step { ldrop(LA) } :: else fi;   /* the cascade ends */
    d_step { ldrop(LB) }
}

/* A prune of A's list, by whichever thread's give-up runs it (observerGaveUp): it takes
 * B's node off while A is pending, once B's walk is done, and lets go of the node's
 * reference on B. A's fire then skips B, and A's cancel reaches B through its link. */
proctype LPruner() {
endIdle:                       /* a valid end: B may never leave */
    lleft;
    d_step {
        if
        :: lstate[LA] == PENDING && !lfired[LB] -> lfired[LB] = 1; ldrop(LB)
        :: else
        fi
    }
}

proctype LBQueue() {           /* B's queue runs B's job */
    byte todo, n, c, cur, next, link;
    bit carried, found, byHold, firedLF, ok, keepSelf;
endIdle:                       /* a valid end: B may never be queued */
    lbJob;
    d_step {
        if
        :: lstate[LB] == PENDING && !lclaimed ->       /* its handler claims, then looks up */
           llookup(LA);
           lstate[LB] = (found -> CANCELLED : FULFILLED);
           keepSelf = lself[LB];                        /* publishLeavingFlight */
           ok = 1;
           lfire_children_of_B(found)
        :: else -> ok = 0; firedLF = 0
        fi
    };
    ldrain();
    if
    :: ok ->
       if :: firedLF -> lfire_queued(); lrun_follower() :: else fi;  /* inside the publish */
       if :: keepSelf -> d_step { ldrop_self(LB) } :: else fi
    :: !ok && lstate[LB] != CANCELLED ->
       llink(LB)                                         /* runContinuation's link */
    :: else
    fi;
    d_step { ldrop(LA) };      /* its handler is done with A */
    d_step { ldrop(LB) }       /* the job ends */
}

proctype LCanceller() {
    byte todo, n, c, cur, next;
    bit byHold;
    todo = BIT(target);
    ldrain();
    d_step { ldrop(target) }
}

init {
    byte n, cur, next;
    bit byHold, side;
    atomic {
        lparent[LR] = LNONE; lparent[LA] = LR; lparent[LB] = LA;
        lparent[LL] = LB; lparent[LF] = LB; lparent[LQ] = LNONE;
        n = 0;
        do :: n < LN -> lalive[n] = 1; lrefs[n] = 1; lstate[n] = PENDING; n++ :: else -> break od;
        /* R: its resolver; A, B, L, F: their parents' observer lists; Q: its work */
        if :: target = LR :: target = LA :: target = LB fi;
        lrefs[target] = lrefs[target] + 1;              /* the canceller's */
        if :: side = 1; lrefs[LB] = lrefs[LB] + 1 :: side = 0 fi;
        if :: bQueued = 1 :: bQueued = 0 fi;
        run LRootSettler(); run LCanceller();
        if :: side -> run LSideSettler(); run LPruner() :: else fi;
        if :: bQueued -> run LBQueue() :: else fi
    }
    timeout;
    assert(lstate[LL] == CANCELLED);
    assert(lstate[LF] == CANCELLED);
    assert(!lqOwned || lstate[LQ] == CANCELLED);
    d_step {                   /* L's queue runs its job (released unrun); Q's work ends */
        if :: lqueued -> lqueued = 0; ldrop(LB); ldrop(LL) :: else fi;
        if :: lobserving -> lobserving = 0; ldrop(LF) :: else fi;
        ldrop(LQ)
    };
    n = 0;
    do
    :: n < LN -> assert(!lalive[n] && lrefs[n] == 0 && lholds[n] == 0); n++
    :: else -> break
    od
}
#endif

#ifdef RETIRE_MODEL
/* ======================================================================================
 * Model "retire" (-DRETIRE_MODEL): a step S of an `.immediate` chain whose child has run,
 * kept by the cascade (one strong reference) and reached by the child's link up (one
 * unowned hold). The retirer (AnyPromise.retireIfOnlyTheCascadeKeepsIt, on the cascade's
 * thread) takes a snapshot of the counts (SwiftRuntime.isOnlyReference: one load of the
 * runtime's count word, which holds the strong and unowned counts and the side-table
 * bit), sets RETIRING (pc_tree_flags_set), fences, takes a second snapshot, then turns
 * RETIRING into RETIRED in one step (pc_tree_flags_update) and frees the value, or clears
 * RETIRING if the second snapshot shows another reference; at the cascade's end it drops
 * its reference.
 *
 * Readers: one reaches S through the child's link (`parent`: swift_tryRetain, then
 * pc_tree_flags_after_fence, which waits while RETIRING is set); one that does not see
 * RETIRED reads the value, then keeps
 * an unowned reference of its own after letting go, and later makes a strong reference
 * from it again (swift_unownedRetainStrong: no flag to look at) and reads once more. A
 * second reader, in some runs, starts with a weak reference of the user's (the object
 * then has a side table) and flips it: weak -> strong (swift_weakLoadStrong), drops the weak one, reads, makes a
 * weak one again, drops the strong one, twice.
 *
 * `strong`, `unowned` (beyond the one the strong references share; the child's link is
 * 1), `weak` and `sidetable` as the runtime keeps them; each d_step is one atomic
 * operation of the runtime or the core.
 *
 * In some runs S is a step that followed its handler's returned promise and adopted in
 * the cascade (`flatMap`): the retirer then expects two strong references (S's own keep,
 * its newest, and the hold its following child took on the path, both dropped only at
 * the cascade's end) and two unowned holds (the child's link up, and S's link in its
 * parent's registry, kept while S's holds keep that parent). And in some runs the user
 * holds S from the start (a strong reference the library never sees taken, or an
 * `unowned` one it turns strong later), reads its value at any time and lets go.
 *
 * Properties: no value is read after it was freed; it is freed at most once; a reader
 * that took S for gone (saw RETIRED) was right: at the end the value is freed (`root`
 * walks past such a step, and `parent` hides it, for good); RETIRED is set only if the
 * value was freed.
 *
 * Broken variants (must FAIL): -DBROKEN_RETIRE_NO_RECHECK frees right after setting the
 * flag; -DBROKEN_RETIRE_SEPARATE_READS reads the strong, weak and unowned counts one
 * after the other (the flipping reader's strong reference, made between two reads with
 * its weak one dropped, is seen by neither); -DBROKEN_RETIRE_FLAG_NOT_FINAL has one flag,
 * RETIRED, set before the second snapshot and cleared if it fails, and readers do not
 * wait (a reader that saw it set then took S for gone, though its own reference made the
 * retirer keep the value); -DBROKEN_RETIRE_COUNTS_A_PASSING_HOLD counts, for the follower
 * shape, a hold that another thread may drop at any time (a child's hold not kept by the
 * cascade): the user's reference then takes its place in the snapshot;
 * -DBROKEN_RETIRE_COUNTS_A_PASSING_LINK counts S's registry link while nothing keeps S's
 * parent alive (S's own hold dropped by the thread that put it in flight): the parent
 * dies, the link's hold on S's memory goes, and the user's `unowned` reference takes its
 * place.
 * ====================================================================================== */

byte strong = 1;     /* the cascade's reference(s) */
byte unowned = 1;    /* the kept child's link up (and S's registry link) */
byte expectStrong = 1;
byte expectUnowned = 1;
byte cascadeDrops = 1;   /* the counted references the cascade's end drops */
byte weak;           /* the flipping reader's, when it runs */
bit  sidetable;      /* made for that weak reference, kept for good */
bit  retiring;
bit  retired;
bit  freed;
bit  skipped;        /* a reader took S for gone */

inline onlyReference(answer) {
#ifdef BROKEN_RETIRE_SEPARATE_READS
    d_step { answer = strong == expectStrong };       /* swift_retainCount */
    if
    :: answer -> d_step { answer = weak == 0 }        /* swift_weakRetainCount */
    :: else
    fi;
    if
    :: answer -> d_step { answer = unowned == expectUnowned }  /* swift_unownedRetainCount */
    :: else
    fi
#else
    d_step { answer = strong == expectStrong && unowned == expectUnowned && !sidetable }   /* one word */
#endif
}

proctype Retirer() {
    bool only;
    onlyReference(only);
    if
    :: only ->
#ifdef BROKEN_RETIRE_FLAG_NOT_FINAL
        d_step { retired = 1 };
#else
        d_step { retiring = 1 };                      /* pc_tree_flags_set, then the fence */
#endif
#ifndef BROKEN_RETIRE_NO_RECHECK
        onlyReference(only);
#endif
        if
        :: only ->
            d_step { retiring = 0; retired = 1 };     /* pc_tree_flags_update */
            d_step { assert(!freed); freed = 1 }      /* freeStoredValueEarly */
        :: else -> d_step { retiring = 0; retired = 0 }
        fi
    :: else
    fi;
    d_step { strong = strong - cascadeDrops }         /* the cascade ends */
}

/* BROKEN_RETIRE_COUNTS_A_PASSING_HOLD: the counted hold the cascade does not keep goes. */
proctype PassingHold() {
    d_step { strong-- }
}

/* The user's own reference, held from the start: a read at any time, then let go. */
proctype UserHolder() {
    assert(!freed);
    d_step { strong-- }
}

inline tryRetain(got) {
    d_step {
        got = strong > 0;
        if :: got -> strong++ :: else fi
    }
}

/* The user's `unowned` reference, held from the start: later it makes a strong one
 * (swift_unownedRetainStrong, a try), reads, and lets both go. */
proctype UserUnowned() {
    bool got;
    tryRetain(got);
    if
    :: got -> assert(!freed); d_step { strong-- }
    :: else
    fi;
    d_step { unowned-- }
}

/* BROKEN_RETIRE_COUNTS_A_PASSING_LINK: S's parent dies, and its registry's hold on S's
 * memory goes, while the retirer still counts it. */
proctype PassingLink() {
    d_step { unowned-- }
}

proctype LinkReader() {
    bool got;
    tryRetain(got);                                   /* `parent`: through the link */
    (!retiring);                                      /* pc_tree_flags_after_fence waits */
    if
    :: got && retired -> d_step { skipped = 1; strong-- }   /* parentIfReachable: gone */
    :: got && !retired ->
        assert(!freed);                               /* reads the value */
        d_step { unowned++ };                         /* keeps an unowned reference */
        d_step { strong-- };
        tryRetain(got);                               /* through it, later */
        if
        :: got -> assert(!freed); d_step { strong-- }
        :: else
        fi;
        d_step { unowned-- }
    :: !got
    fi
}

proctype FlippingReader() {
    bool got;
    byte flips;
    do
    :: flips < 2 ->
        tryRetain(got);                               /* swift_weakLoadStrong */
        if
        :: !got -> break
        :: else
        fi;
        d_step { weak-- };                            /* the weak one dropped */
        assert(!freed);                               /* reads the value */
        d_step { weak++ };                            /* weak again */
        d_step { strong-- };                          /* the strong one dropped */
        flips++
    :: else -> break
    od;
    skip;                                             /* (a break may not jump into a d_step) */
    d_step { weak-- }
}

init {
    atomic {
        if                                            /* with or without a user's weak reference */
        :: weak = 1; sidetable = 1; run FlippingReader()
        :: skip
        fi;
        if                                            /* a `then` step, or a `flatMap` step */
        :: skip
        :: strong = 2; unowned = 2; expectStrong = 2; expectUnowned = 2; cascadeDrops = 2
        fi;
#ifdef BROKEN_RETIRE_COUNTS_A_PASSING_HOLD
        if
        :: expectStrong == 2 -> cascadeDrops = 1; run PassingHold()
        :: else
        fi;
#endif
        if                                            /* with or without a user's reference */
        :: strong++; run UserHolder()
        :: unowned++; run UserUnowned()
        :: skip
        fi;
#ifdef BROKEN_RETIRE_COUNTS_A_PASSING_LINK
        if
        :: expectUnowned == 2 -> run PassingLink()
        :: else
        fi;
#endif
        run Retirer();
        run LinkReader()
    }
    timeout;
    assert(strong == 0);
    assert(!retired || freed);
    assert(!skipped || freed)
}
#endif

#ifdef PARK_MODEL
/* ======================================================================================
 * Model "park" (-DPARK_MODEL): a child C whose parent P has settled (fulfilled) and fired
 * it, with C's handler to run on a context. The firing thread parks its hold on P in C's
 * `settledParent` word, marked (parkSettledParentForContext: pc_word_store, pc_fence),
 * then reads C's claim: still free, it sends the work; claimed, it takes the hold back
 * (pc_word_take_marked) and sends nothing. A settler claims C (pc_claim FREE ->
 * CANCELLED, a full CAS), then takes a marked hold (dropHandlerParkedForContext, from
 * publishOutcomeFromHolder): it stands for every settle that is not the handler's (a
 * cancel, the holder's fulfil or reject, an outcome adopted from a promise C follows, a
 * claim turned into a cancel), whose claim CAS is the same. The work,
 * once sent, may run or never run (a suspended queue): it takes the hold (pc_word_take),
 * and if it got it runs the handler, which claims C (FREE -> FULFILLED) unless the cancel
 * came first. Whoever takes the hold releases it and the handler; the others leave both.
 *
 * Properties: the hold is taken at most once; when every process is done, a C settled
 * by the settler has let go of it (taken once) whether or not the work ran, and a C that
 * was not still has it parked unless the work ran; the handler runs at most once, only
 * with the hold, and only if it claimed C.
 *
 * Broken variants (must FAIL):
 *   -DBROKEN_PARK_NO_RECHECK  the parker sends the work without reading the claim: a
 *                             settle before the store finds nothing to take, and the hold
 *                             waits for work that never runs.
 *   -DBROKEN_PARK_NO_FENCE    the parker's claim load is satisfied before its store is
 *                             visible (StoreLoad reordering without pc_fence): each side
 *                             misses the other.
 * ====================================================================================== */

byte claim = FREE;       /* C's claim word */
bit  parked = 0;         /* C's settledParent word holds the marked hold */
bit  sent = 0;           /* the work was handed to the context */
byte takes = 0;          /* how many took the hold (each releases P and the handler) */
byte handlerRuns = 0;
bit  workRan = 0;

inline take_marked(got) {   /* pc_word_take_marked: one CAS from the marked value to 0 */
    d_step { if :: parked -> parked = 0; takes++; got = 1 :: else -> got = 0 fi }
}

proctype Parker() {
    bool got;
    byte seen;
#ifdef BROKEN_PARK_NO_FENCE
    seen = claim;                                 /* the load, satisfied early... */
    parked = 1;                                   /* ...before the store is visible */
#else
    parked = 1;                                   /* pc_word_store(marked hold); pc_fence */
    seen = claim;                                 /* claimHint */
#endif
#ifdef BROKEN_PARK_NO_RECHECK
    seen = FREE;
#endif
    if
    :: seen != FREE -> take_marked(got)           /* dropHandlerParkedForContext */
    :: else -> sent = 1                           /* sendToContext */
    fi
}

proctype Canceller() {
    bool got;
    bool won;
    d_step { if :: claim == FREE -> claim = CANCELLED; won = 1 :: else -> won = 0 fi };
    if
    :: won -> take_marked(got)                    /* publishOutcomeFromHolder: the drop */
    :: else
    fi
}

proctype Work() {
    bool got;
end_unsent:
    sent;                                         /* runs only once sent... */
    if
    :: skip                                       /* ...and maybe never */
    :: d_step {                                   /* pc_word_take (takeSettledParentOnce) */
           workRan = 1;
           if :: parked -> parked = 0; takes++; got = 1 :: else -> got = 0 fi
       };
       if
       :: got ->
           d_step {                               /* runContinuation: the handler claims C */
               if :: claim == FREE -> claim = FULFILLED; handlerRuns++ :: else fi
           }
       :: else
       fi
    fi
}

init {
    atomic { run Parker(); run Canceller(); run Work() }
    timeout;
    assert(takes <= 1);
    assert(handlerRuns <= 1);
    assert(claim != CANCELLED || takes == 1);         /* a cancelled child keeps nothing */
    assert(claim == CANCELLED || workRan || parked);  /* otherwise the hold waits for the work */
    assert(handlerRuns == 0 || claim == FULFILLED)
}
#endif
