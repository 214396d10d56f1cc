import CPromiseCore

/// A typed value that will be available later, or an error instead: settled once, by
/// whoever wins the race to fulfil, reject or cancel it, and observed from any thread
/// without locks.
///
/// ```swift
/// let greeting = Promise<String>()
/// greeting
///     .then { $0.uppercased() }
///     .then(on: .main) { text in MainActor.assumeIsolated { label.text = text } }
/// greeting.fulfill("hello")
/// ```
///
/// The resolver side (`fulfill`, `reject`, `resolve`, `cancel`) and the observer side
/// (`then` and friends) are both thread-safe: exactly one of any number of racing
/// resolvers wins, later ones return `false`, and every handler runs once with the
/// winning outcome.
///
/// Threading: a promise is a lock-free C state machine (see `pc_promise.h`) plus a
/// value slot written once by the winning resolver before it publishes the outcome.
///
/// Not `open`: no code outside this module can subclass it. Not `final` either: the
/// promises that `then` and the other continuations make, and `timeout`'s and `delay`'s,
/// are of an internal subclass that adds what only a promise with a parent needs, so
/// that a root is smaller. Its members stay `final`. What that changes for a client:
/// `type(of:)` on such a promise names the subclass (test with `is Promise<Value>` or
/// `as?`; `description` says `Promise<Value>` for both), and an extension cannot add a
/// conformance whose requirements include an initialiser (`ExpressibleByNilLiteral`,
/// `Decodable`), which a class that is not final must declare `required` in its body.
public class Promise<Value: Sendable>: AnyPromise, @unchecked Sendable {
    // The value lives in the core's `payload` words (see `ValueStorage.swift`), not in a
    // `Value?` property: code that runs without knowing `Value` statically (the fire
    // path, the destructor) then needs no generic metadata lookup to reach it.

    /// A pending promise; settle it with `fulfill`, `reject`, `resolve` or `cancel`.
    ///
    /// `file` and `line` name where it was made (SwiftNIO's `makePromise(file:line:)`):
    /// debug builds of the library record them for `debugDescription` and
    /// `PromiseDiagnostics`; release builds record nothing and, the initialisers being
    /// inlinable, pass nothing either. Leave them to their defaults.
    @inlinable
    public init(file: StaticString = #fileID, line: UInt = #line) {
        super.init()
        noteCreationSite(file: file, line: line)
    }

    /// A pending promise made by the library for the caller (a combinator's output, a
    /// timer's promise): it records no creation site, which would name the library's own
    /// source (`PromiseDiagnostic.creationSite` is nil for such promises).
    @usableFromInline
    init(madeByLibrary: Void) {
        super.init()
    }

    /// `init(madeByLibrary:)`, already rejected with `error`.
    static func madeByLibrary(rejectedWith error: any Error) -> Promise<Value> {
        let promise = Promise(madeByLibrary: ())
        promise.reject(error)
        return promise
    }

    /// A promise already fulfilled with `value` (`file` and `line`: see `init(file:line:)`).
    @inlinable
    public init(value: Value, file: StaticString = #fileID, line: UInt = #line) {
        super.init()
        noteCreationSite(file: file, line: line)
        fulfill(value)
    }

    /// A promise already rejected with `error` (`file` and `line`: see `init(file:line:)`).
    @inlinable
    public init(error: any Error, file: StaticString = #fileID, line: UInt = #line) {
        super.init()
        noteCreationSite(file: file, line: line)
        reject(error)
    }

    /// A promise already settled with `result` (`file` and `line`: see `init(file:line:)`).
    @inlinable
    public init(result: Result<Value, any Error>, file: StaticString = #fileID, line: UInt = #line) {
        super.init()
        noteCreationSite(file: file, line: line)
        resolve(result)
    }

    /// `init(result:)` for a `Result` with a specific error type
    /// (`Result<Data, NetworkError>`).
    ///
    /// ```swift
    /// let cached = Promise(result: cache.lookup(key))   // a Result<Data, CacheError>
    /// ```
    @inlinable
    public init<Failure: Error>(result: Result<Value, Failure>, file: StaticString = #fileID, line: UInt = #line) {
        super.init()
        noteCreationSite(file: file, line: line)
        resolve(result)
    }

    /// Runs `body` synchronously, once, handing it the resolver functions; a throw rejects.
    ///
    /// ```swift
    /// let p = Promise<Data> { fulfill, reject in
    ///     legacyFetch { data, error in
    ///         if let data { fulfill(data) } else { reject(error ?? FetchError.empty) }
    ///     }
    /// }
    /// ```
    public convenience init(
        _ body: (_ fulfill: @escaping @Sendable (Value) -> Void,
                 _ reject: @escaping @Sendable (any Error) -> Void) throws -> Void,
        file: StaticString = #fileID,
        line: UInt = #line
    ) {
        self.init(file: file, line: line)
        do {
            try body({ [self] value in self.fulfill(value) }, { [self] error in self.reject(error) })
        } catch {
            reject(error)
        }
    }

    /// Runs `work` on `context`; its return value fulfils the promise, a throw rejects it.
    ///
    /// ```swift
    /// let digest = Promise<String>(on: .default) { try sha256(of: file) }
    /// ```
    ///
    /// A cancel that settles the promise before the work starts skips it (the work is
    /// what the promise owns). A promise settled otherwise first (its holder fulfilled it,
    /// say) still runs it, for its side effects, and ignores its result. A context that
    /// drops the work unrun (an `OperationQueue` whose operations were cancelled) rejects
    /// the promise with `PromiseError.brokenPromise`.
    public convenience init(
        on context: any ExecutionContext,
        _ work: @escaping @Sendable () throws -> Value,
        file: StaticString = #fileID,
        line: UInt = #line
    ) {
        self.init(file: file, line: line)
        // Once, also on a context that runs its work twice (a broken contract); a context
        // that drops it unrun breaks the promise (see `WatchedWork`).
        let watched = WatchedWork({ [self] in
            guard !self.isClaimedAsCancel else { return }  // cancelled before it ran
            self.settle(work)
        }, ifDropped: { [self] in self.rejectAsWorkDropped() })
        context.execute(watched.work)
    }

    deinit {
        destroyStoredValue()
    }

    /// A derived promise: `DerivedPromise`'s initialisers, after setting up its lineage.
    /// Only for them: a `Promise` made this way would have no lineage to read.
    @usableFromInline @inline(__always)  // into DerivedPromise's initialisers: a call fewer per child
    override init(derived: Void) {
        super.init(derived: ())
        assert(self is DerivedPromise<Value>, "only a DerivedPromise is a derived promise")
    }

    /// Settles this promise, if still free, as `source` (of the same `Value`, or the
    /// broken stand-in of a promise that died pending) settled; when `parent` is given (the
    /// source is this promise's parent), a cancel that reached it or an ancestor first
    /// wins, as for a handler's child (`cancelReasonFromAncestors`). False if it was not
    /// free: settled, or locked in to follow another promise (`resolve(with:)`).
    @discardableResult
    final func adoptOutcome(of source: AnyPromise, lookingAbove parent: AnyPromise?) -> Bool {
        let tag = source.publishedTag
        guard claim(from: PC_CLAIM_FREE, to: UInt32(tag)) else { return false }
        fillClaimedOutcome(tag, copying: source, lookingAbove: parent)
        publishClaimedOutcome()
        passOnClaimedCancel()
        return true
    }

    // MARK: Resolver side

    /// Fulfils the promise with `value`. Returns false, and changes nothing, if it had
    /// already been settled (or is following another promise). A derived promise (made by
    /// `then` and the like) that a cancel of an ancestor reached first takes that cancel
    /// instead, and this returns false: `.immediate` children waiting in the firing batch
    /// of another thread read as pending until it reaches them (see the Cancellation
    /// article).
    @inlinable @discardableResult
    public final func fulfill(_ value: Value) -> Bool {
        // Roots and a root's children keep nothing (see `publishKeepingParent`).
        guard holdsItsParentInFlight else {
            guard claim(from: PC_CLAIM_FREE, to: PC_FULFILLED) else { return false }
            if !isRoot { return fulfillClaimedChild(value, keeping: nil) }  // a root's child
            storeValue(value)
            pc_publish(corePointer)
            if rareStateWordValue != 0 { settledRootLetsGoOfItsInputs() }  // a combinator's output, say
            return true
        }
        return fulfillKeepingParent(value)
    }

    /// `fulfill` for a promise below a non-root parent, which its settle keeps
    /// (`publishKeepingParent`). Inlinable for specialisation, not inlined: the common
    /// caller settles a root.
    @inlinable @inline(never)
    final func fulfillKeepingParent(_ value: Value) -> Bool {
        let parent = parentToKeepForSettle()
        guard claim(from: PC_CLAIM_FREE, to: PC_FULFILLED) else {
            parent?.release()
            return false
        }
        return fulfillClaimedChild(value, keeping: parent)
    }

    /// The rest of `fulfill` for a derived promise whose holder won the claim: a cancel
    /// that reached an ancestor first wins over the value, as over a handler's result
    /// (`cancelReasonAfterHolderClaim`); then this returns false, the promise cancelled.
    @inlinable @inline(never)
    final func fulfillClaimedChild(_ value: Value, keeping parent: Unmanaged<AnyPromise>?) -> Bool {
        if let reason = cancelReasonAfterHolderClaim(keeping: parent) {
            publishHolderClaimAsCancel(from: PC_FULFILLED, reason: reason, keeping: parent)
            return false
        }
        storeValue(value)
        publishOutcomeFromHolder(keeping: parent)
        return true
    }

    /// Rejects the promise with `error`. Returns false if it had already been settled,
    /// or if a cancel of an ancestor reached it first (as for `fulfill`).
    @inlinable @discardableResult
    public final func reject(_ error: any Error) -> Bool {
        settleFailure(error, as: PC_REJECTED)
    }

    /// Fulfils or rejects the promise with `result`. Returns false if already settled.
    @inlinable @discardableResult
    public final func resolve(_ result: Result<Value, any Error>) -> Bool {
        switch result {
        case .success(let value): return fulfill(value)
        case .failure(let error): return reject(error)
        }
    }

    /// `resolve(_:)` for a `Result` with a specific error type
    /// (`Result<Data, NetworkError>`): the error rejects the promise as it is.
    ///
    /// ```swift
    /// client.fetch(url) { (result: Result<Data, NetworkError>) in page.resolve(result) }
    /// ```
    @inlinable @discardableResult
    public final func resolve<Failure: Error>(_ result: Result<Value, Failure>) -> Bool {
        resolve(result.mapError { $0 as any Error })
    }

    /// Makes this promise follow `other`: it settles as `other` does (fulfilled,
    /// rejected or cancelled). From this call on the promise is locked in: later
    /// `fulfill`, `reject` and `resolve` calls are ignored; `cancel` still works (and
    /// leaves `other` alone). Ignored if the promise was settled already. The output of
    /// `retry`, `sequence` or `all(_:maxConcurrent:)` locked in this way stops its run:
    /// no attempt or input starts after, the work in flight goes on unobserved, and the
    /// run lets go of the user's code and of the results it had.
    ///
    /// A promise never waits on itself: `p.resolve(with: p)`, closing a cycle of promises
    /// that follow each other (`a.resolve(with: b); b.resolve(with: a)`), or following a
    /// combinator over itself that nothing else can settle (an `allSettled` it is an input
    /// of; a `race`, `any`, `all` or `and` whose other inputs wait on it too, or settled
    /// without settling it: fulfilled for `all` and `and`, rejected for `any`; a `retry`,
    /// `sequence` or `all(_:maxConcurrent:)` whose steps in flight all wait on it) rejects
    /// it with `PromiseError.cycle` (Promises/A+ 2.3.1), and with it every promise of the
    /// cycle, which follow it. `p.resolve(with: Promise.race([p, shutdown]))` is no cycle:
    /// `shutdown` can settle it. Cycles through combinators are looked for within a
    /// bounded walk (64 combinators nested in each other's paths, 1,024 promises past the
    /// first): one that only a longer walk would find stays pending.
    ///
    /// ```swift
    /// let a = Promise<Int>(), b = Promise<Int>()
    /// a.resolve(with: b)
    /// b.resolve(with: a)      // b and a reject with PromiseError.cycle
    /// ```
    ///
    /// Cost: one allocation (the observer on `other`); on a root, a second the first time,
    /// its rare state, where a root keeps the link to the promise it follows.
    public final func resolve(with other: Promise<Value>) {
        guard claim(from: PC_CLAIM_FREE, to: PC_CLAIM_FOLLOWING) else { return }
        recordFollowee(other, forwardsCancel: false)
        // A box, not our own node: a continuation child's node may still be registered
        // on its parent.
        FollowObserver(target: self).register(on: other)
        // Cancelled before the link above was recorded, the cancel could not find `other`
        // to leave it (`leavePendingSources`): the box gives up here instead.
        if claimHint == UInt(PC_CANCELLED) { other.observerGaveUp() }
        if closesACycle(following: other) { rejectAsCycle(parent: nil) }
        // The output of a run (`retry`, `sequence`, `all(_:maxConcurrent:)`): the run
        // cannot settle it any more, and the cycle check walks on through `other`.
        if let run = settlerIfAlive {
            forgetRun()
            run.outputLockedIn()
        }
    }

    final override func makeBrokenStandIn() -> AnyPromise {
        Promise.madeByLibrary(rejectedWith: PromiseError.brokenPromise)
    }

    final override func freeStoredValueEarly() {
        destroyStoredValue()
        storedValueNeedsDestroy = false
        outcomeFreeableEarly = false
    }

    final override var typeName: String {
        "Promise<\(Value.self)>"
    }

    final override func describeFulfilledValue() -> String {
        String(reflecting: storedValue)
    }

    final override func copyOutcome(from source: AnyPromise, tag: UInt) {
        let source = unsafeDowncast(source, to: Promise<Value>.self)
        if tag == UInt(PC_FULFILLED) {
            storeValue(source.storedValue)
        } else {
            failure = source.failure
            if tag == UInt(PC_REJECTED) {
                source.noteErrorSeen()  // passed on: seen
                outcomeFreeableEarly = true
            }
        }
    }
}

extension Promise where Value == Void {
    /// Fulfils a `Promise<Void>`: `done.fulfill()` for `done.fulfill(())`. Returns false,
    /// and changes nothing, if it had already been settled (as `fulfill(_:)`).
    ///
    /// ```swift
    /// let flushed = Promise<Void>()
    /// log.flush { flushed.fulfill() }
    /// ```
    ///
    /// Disfavoured: `done.fulfill` unapplied (a function value) still names `fulfill(_:)`.
    @inlinable @discardableResult @_disfavoredOverload
    public final func fulfill() -> Bool {
        fulfill(())
    }
}
