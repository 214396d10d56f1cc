import CPromiseCore

/// A small object that observes a promise without being one: the one allocation behind
/// `whenComplete` on any context but `.immediate` (there, a bare `CompletionNode`),
/// `onCancel`, `resolve(with:)` and `wait`. Its node is its first stored property (see
/// `CoreBridge.swift`).
///
/// A box runs inline, through the trampoline (`.immediate`), unless it is `queued`: then
/// its subclass overrides `scheduleFire`, sending the box to its context (one it stores,
/// or the default queue, which needs none). The immediate kinds carry no context at all:
/// destroying even an empty existential costs a value witness call.
@usableFromInline
class ObserverBox: @unchecked Sendable {
    final var node = pc_node()
    /// The promise that settled: retained, or borrowed when the fire callback says so
    /// (`fireBorrowingSource`); set when the node fires, taken when the box runs.
    /// (`Unmanaged`: storing into a strong optional would also release the old nil.)
    @usableFromInline @exclusivity(unchecked) final var heldSource: Unmanaged<AnyPromise>?
    /// True if the box runs on a context (`scheduleFire`), false for `.immediate`. A
    /// property of the kind of box (overridden), not a stored flag: the flag's padding
    /// cost 16 bytes per box.
    @usableFromInline
    var queued: Bool { false }

    /// Whether the box has nothing left to do whatever the promise it observes does, so
    /// that it may leave that promise while it is pending (`observerHasGivenUp`): a
    /// `resolve(with:)` whose follower was cancelled, a run's `StepObserver` once the run's
    /// output settled.
    var gaveUp: Bool { false }

    /// Whether the box waits for the promise's outcome, so that the promise dying pending
    /// leaves it waiting (the broken-promise report, `anyoneWaits`): all but `onCancel`,
    /// which waits for a cancel, and which freeing is not.
    var waitsForOutcome: Bool { true }

    @inlinable
    init() {}

    /// `heldSource`'s word, found from the object's address (it follows `node`, the first
    /// stored property), not through the property: two runs of `fireOnce` at once must
    /// not make formal accesses to it (ThreadSanitizer reports those, however the property
    /// is marked). Debug builds check the offset as a box is made (`checkHeldSourceOffset`).
    private var heldSourceWord: UnsafeMutablePointer<UInt> {
        (UnsafeMutableRawPointer(Unmanaged.passUnretained(self).toOpaque()) + CoreLayout.headerSize
            + MemoryLayout<pc_node>.stride).assumingMemoryBound(to: UInt.self)
    }

    /// Debug builds: `heldSourceWord` is `heldSource`'s address (called before the box is
    /// shared, so the formal access here overlaps no other thread's).
    @usableFromInline
    final func checkHeldSourceOffset() -> Bool {
        withUnsafeMutablePointer(to: &heldSource) { UnsafeMutableRawPointer($0) } == UnsafeMutableRawPointer(heldSourceWord)
    }

    /// Hands `fire` to the box's context (queued boxes only).
    @usableFromInline
    func scheduleFire() {
        preconditionFailure("an immediate ObserverBox has no context")
    }

    /// Runs the observation once, after `source` settled (on the context if `queued`).
    final func fire() {
        let settled = heldSource.unsafelyUnwrapped.takeRetainedValue()
        heldSource = nil
        run(settled)
    }

    /// `fire`, from work handed to a context the user gave: such a context must run the
    /// work once, but one that runs it twice (a contract broken) gets one run, not a crash:
    /// the source is taken with one atomic exchange, and the second run finds it gone.
    final func fireOnce() {
        guard let source = UnsafeMutableRawPointer(bitPattern: takeWord(heldSourceWord)) else { return }
        run(Unmanaged<AnyPromise>.fromOpaque(source).takeRetainedValue())
    }

    /// `fire`, when `heldSource` holds the source unretained (its settling call's caller
    /// holds it until this has run: see `observerBoxFire`).
    final func fireBorrowingSource() {
        let settled = heldSource.unsafelyUnwrapped
        heldSource = nil
        settled._withUnsafeGuaranteedRef { run($0) }
    }

    deinit {
        // Fired, but its context dropped the work unrun: only a queued box can die holding
        // its source, and a queued box always retains it.
        heldSource?.release()
    }

    @usableFromInline
    func run(_ source: AnyPromise) {
        preconditionFailure("ObserverBox is abstract")
    }
}

/// `whenComplete` on `.immediate` (all but a root's first, which the root keeps in its own
/// slot): a bare node, not an object. A box would add a Swift object's header and its
/// reference counting (an 80-byte chunk, and about 140 instructions an observer spends
/// making, releasing and destroying it); this is 56 bytes (a 64-byte chunk): the core's
/// node, the settled promise while the run waits in the trampoline, the closure that
/// knows `Value`, and the user's closure after them (`bodyOffset`).
///
/// Nobody holds it but the list it is in: it fires exactly once (when the promise
/// settles, or on its broken stand-in if the promise dies pending; it never gives up, so
/// no prune takes it off), and the run frees it. It has no room for a context: the other
/// contexts keep their boxes, whose work closure captures the box, a single reference, so
/// sending it to the context allocates nothing.
@usableFromInline
struct CompletionNode {
    @usableFromInline var node: pc_node
    /// The settled promise's address while the node waits in the trampoline: a retained
    /// reference, or borrowed when the fire callback says so (`completionNodeFire`).
    @usableFromInline var source: UInt
    /// Moves the user's closure out of the node (at `bodyAddress`) and calls it with the
    /// source's result. Made in the registering caller's specialisation, where it knows
    /// `Value` and captures nothing (no allocation; unspecialised, it captures `Value`'s
    /// metadata), as `CompletionObserver.deliver`.
    @usableFromInline var deliver: @Sendable (_ source: AnyPromise, _ bodyAddress: UnsafeMutableRawPointer) -> Void

    @usableFromInline
    typealias Body<Value: Sendable> = @Sendable (Result<Value, any Error>) -> Void

    /// The user's closure as the node stores it: in a struct's stored property, which
    /// keeps the closure in the form the caller passed it in. Stored bare, as the `Pointee`
    /// of a generic pointer, a closure takes the most general form, which costs every
    /// closure that captures anything a reabstraction thunk: a heap context, a malloc.
    @usableFromInline
    struct StoredBody<Value: Sendable> {
        @usableFromInline var body: Body<Value>
        @inlinable init(_ body: @escaping Body<Value>) { self.body = body }
    }

    @inlinable
    init(deliver: @escaping @Sendable (AnyPromise, UnsafeMutableRawPointer) -> Void) {
        self.node = pc_node()
        self.source = 0
        self.deliver = deliver
    }

    /// Where the user's closure starts, after the fields above.
    @inlinable
    static var bodyOffset: Int { MemoryLayout<CompletionNode>.stride }

    /// The node's size: the fields above and the user's closure (two words, as every
    /// closure is).
    @inlinable
    static var byteCount: Int { bodyOffset + MemoryLayout<StoredBody<Never>>.size }

    /// A node for `body`, not yet registered (`registerCompletionNode`).
    @inlinable
    static func make<Value: Sendable>(body: @escaping Body<Value>) -> UnsafeMutablePointer<CompletionNode> {
        // The core's node is at the start: the fire callbacks treat the two addresses as one.
        assert(MemoryLayout<CompletionNode>.offset(of: \CompletionNode.node) == 0)
        let raw = SwiftRuntime.allocate(byteCount: byteCount)
        let node = raw.initializeMemory(as: CompletionNode.self, repeating: CompletionNode(
            deliver: { source, bodyAddress in
                let body = bodyAddress.assumingMemoryBound(to: StoredBody<Value>.self).move().body
                body(unsafeDowncast(source, to: Promise<Value>.self).publishedResult)
            }), count: 1)
        (raw + bodyOffset).initializeMemory(as: StoredBody<Value>.self, repeating: StoredBody(body), count: 1)
        return node
    }

    /// Runs the node once its source settled, then frees it: the one thread that fired it
    /// owns it.
    static func run(_ completion: UnsafeMutablePointer<CompletionNode>, source: AnyPromise) {
        let deliver = completion.move().deliver  // the node's fields are left uninitialised
        deliver(source, UnsafeMutableRawPointer(completion) + bodyOffset)  // moves the user's closure out
        SwiftRuntime.deallocate(UnsafeMutableRawPointer(completion), byteCount: byteCount)
    }
}

/// `whenComplete` on a context: hands the outcome to a closure. The base of the boxes
/// that are sent to a context (`.immediate` observers are `CompletionNode`s).
@usableFromInline
class CompletionObserver<Value: Sendable>: ObserverBox, @unchecked Sendable {
    @usableFromInline let body: @Sendable (Result<Value, any Error>) -> Void
    /// Builds the `Result` and calls `body`. Created by the inlinable initialiser, so in
    /// the caller's specialisation: a capture-free closure (no allocation) whose code
    /// knows `Value`, where `run`, called through the class, would not (and would look up
    /// `Result<Value, Error>`'s metadata on every call).
    @usableFromInline let deliver: @Sendable (AnyPromise, @Sendable (Result<Value, any Error>) -> Void) -> Void

    @inlinable
    init(body: @escaping @Sendable (Result<Value, any Error>) -> Void) {
        self.body = body
        self.deliver = { source, body in
            body(unsafeDowncast(source, to: Promise<Value>.self).publishedResult)
        }
        super.init()
    }

    @usableFromInline
    override final func run(_ source: AnyPromise) {
        deliver(source, body)
    }
}

/// `whenComplete` on a context other than `.immediate` and `.default`.
@usableFromInline
final class QueuedCompletionObserver<Value: Sendable>: CompletionObserver<Value>, @unchecked Sendable {
    /// Moved out when the box is sent to it (by the one thread that fires the box), or
    /// destroyed with the box if it never was. In 32 bytes, not an existential's 40.
    @usableFromInline @exclusivity(unchecked) var context: StoredContext

    @inlinable
    init(context: __shared any ExecutionContext, body: @escaping @Sendable (Result<Value, any Error>) -> Void) {
        self.context = StoredContext(context)
        super.init(body: body)
        assert(checkHeldSourceOffset(), "ObserverBox.heldSource moved: see heldSourceWord")
    }

    deinit {
        context.destroy()  // never fired (once sent, the context moved out: nothing to do)
    }

    @usableFromInline
    override var queued: Bool { true }

    @usableFromInline
    override func scheduleFire() {
        // On Dispatch's queues, the box goes without a block (`DispatchBridge`).
        if context.send(retaining: self, { box in
            Unmanaged<ObserverBox>.fromOpaque(box.unsafelyUnwrapped).takeRetainedValue().fireOnce()
        }) { return }
        context.send { self.fireOnce() }
    }
}

/// `whenComplete` on `.default`: queued like the box above, but on the library's default
/// queue, which is one for all, so it stores no context (an 80-byte chunk, not 128).
@usableFromInline
final class DefaultQueueCompletionObserver<Value: Sendable>: CompletionObserver<Value>, @unchecked Sendable {
    @inlinable
    override init(body: @escaping @Sendable (Result<Value, any Error>) -> Void) {
        super.init(body: body)
    }

    @usableFromInline
    override var queued: Bool { true }

    @usableFromInline
    override func scheduleFire() {
        if DispatchBridge.sendToDefaultQueue(retaining: self, { box in
            Unmanaged<ObserverBox>.fromOpaque(box.unsafelyUnwrapped).takeRetainedValue().fire()
        }) { return }
        DefaultExecutionContext().execute { self.fire() }
    }
}

/// `onCancel`: runs a closure, with the reason, if the promise ends cancelled.
final class CancelObserver: ObserverBox, @unchecked Sendable {
    let body: @Sendable (any Error) -> Void

    init(body: @escaping @Sendable (any Error) -> Void) {
        self.body = body
        super.init()
    }

    override var waitsForOutcome: Bool { false }

    override func run(_ source: AnyPromise) {
        if source.isCancelled { body(source.failureOrCancellation) }
    }
}

/// `resolve(with:)`: settles `target` (claimed as following) as the source settled.
final class FollowObserver<Value: Sendable>: ObserverBox, @unchecked Sendable {
    /// The follower: the followed promise holds it through this box (a link down).
    private let target: Promise<Value>

    init(target: Promise<Value>) {
        self.target = target
        super.init()
    }

    /// A follower whose claim is no longer FOLLOWING takes no outcome (cancelled, or
    /// rejected as a cycle): its claim is final, published or not yet.
    override var gaveUp: Bool { target.claimHint != UInt(PC_CLAIM_FOLLOWING) }

    /// The follower takes the followed promise's outcome. Settled by someone other than
    /// its handler (as by its holder), it keeps its parent from before its claim through
    /// the cascade of its publish (`publishKeepingParent`).
    override func run(_ source: AnyPromise) {
        let tag = source.publishedTag
        let parent = target.parentToKeepForSettle()
        guard target.claim(from: PC_CLAIM_FOLLOWING, to: UInt32(tag)) else {
            parent?.release()
            return  // cancelled meanwhile
        }
        // An ancestor's cancel that came first wins over the adopted outcome.
        if tag != UInt(PC_CANCELLED), let reason = target.cancelReasonAfterHolderClaim(keeping: parent) {
            target.turnClaimIntoCancel(from: UInt32(tag), reason: reason)
        } else {
            target.copyOutcome(from: source, tag: tag)
        }
        target.publishOutcomeFromHolder(keeping: parent)
        target.passOnClaimedCancel()
    }
}

/// The first observer of a root that died pending, moved out of the root's inline slot
/// (whose memory goes with the root) so that it can fire on the broken stand-in
/// (`AnyPromise.breakObservers`).
final class MovedSlotObserver: ObserverBox, @unchecked Sendable {
    private var observer: StoredHandler?
    private let context: (any ExecutionContext)?

    init(_ observer: consuming StoredHandler, context: (any ExecutionContext)?) {
        self.observer = consume observer
        self.context = context
        super.init()
        assert(checkHeldSourceOffset(), "ObserverBox.heldSource moved: see heldSourceWord")
    }

    override var queued: Bool { context != nil }

    override func scheduleFire() {
        ContextCalls.execute({ self.fireOnce() }, on: context.unsafelyUnwrapped)
    }

    override func run(_ source: AnyPromise) {
        observer.take()?.run(source, source)
    }
}

/// A hook of the library's own on a promise's outcome, whatever it is: how a run
/// (`retry`, `sequence`, `all(_:maxConcurrent:)`) learns that its output settled, by the
/// run itself, by whoever holds the output, or by a cancel. It waits for nothing: it is no
/// reader of the output's error (an unread rejection is still reported), and neither the
/// broken-promise report nor `debugDescription` counts it as a waiting observer.
final class OutcomeHook: ObserverBox, @unchecked Sendable {
    let body: @Sendable (AnyPromise) -> Void

    init(body: @escaping @Sendable (AnyPromise) -> Void) {
        self.body = body
        super.init()
    }

    override var waitsForOutcome: Bool { false }

    override func run(_ source: AnyPromise) {
        body(source)
    }
}

/// What a run (`retry`, `sequence`, `all(_:maxConcurrent:)`) registers on its step in
/// flight (an attempt, a work's promise, a pause): hands the step's result to the run,
/// unless the run's output settled first. From then on it waits for nothing
/// (`gaveUp`): a step that lives on (a long-lived promise that the work returned) takes it
/// off at its next prune (`observerGaveUp`, which the run calls when its output settles),
/// and with it the run. The run itself lets go of the user's code, its results and its
/// inputs when its output settles, so what such a step keeps until that prune is the
/// box, the run's own fields and its output: a bounded trace, as for the slots of settled
/// combinators, and none where the run's was the step's first observer to give up (the
/// first give-up prunes).
final class StepObserver<Value: Sendable>: ObserverBox, @unchecked Sendable {
    /// The run's output, by its memory (`HeldMemory`): `body` holds the run, which holds
    /// the output, for as long as the box may run.
    private let output: UnsafeMutableRawPointer
    private var body: (@Sendable (Result<Value, any Error>) -> Void)?

    init(until output: AnyPromise, body: @escaping @Sendable (Result<Value, any Error>) -> Void) {
        self.output = UnsafeMutableRawPointer(bitPattern: HeldMemory.hold(Unmanaged.passUnretained(output))).unsafelyUnwrapped
        self.body = body
        super.init()
    }

    deinit {
        HeldMemory.release(output)
    }

    /// Read by a pruner of the step, which holds the step's stack: the output's claim
    /// word, one load (the box holds its memory). Claimed for an outcome, or locked in to
    /// follow another promise, the output takes nothing from the run any more.
    override var gaveUp: Bool { !HeldMemory.isFreeToSettlePromise(at: output) }

    override func run(_ source: AnyPromise) {
        // The run's output settled (or locked in) first: nothing to hand over (and nothing
        // to start). The run counts as reading its step's error all the same, as a
        // combinator does.
        guard !gaveUp else {
            body = nil
            source.noteErrorSeenIfRejected()
            return
        }
        let result = unsafeDowncast(source, to: Promise<Value>.self).publishedResult
        body.take()?(result)
    }
}
