import CPromiseCore

// What a server operator needs on the first incident: where a dropped promise was made,
// which errors nobody saw, and cycles. The library never prints: it hands each event to
// one handler the application installs, which routes it to its logger or metrics. With no
// handler set, a report costs one load, made only where something is reported (a
// rejected promise's death, a broken promise, a cycle); the creation site is recorded by
// debug builds of the library only, so a release build stores and passes nothing for it.

/// Where a promise was made: the `#fileID` and `#line` of the initialiser's call.
/// Recorded by debug builds of the library only.
///
/// ```swift
/// let order = Promise<Order>()          // debug builds record "App/Orders.swift:12"
/// debugPrint(order)                      // ..., made at App/Orders.swift:12
/// ```
public struct PromiseCreationSite: Sendable, Equatable, CustomStringConvertible {
    /// The file, as `#fileID` names it (`Module/File.swift`).
    ///
    /// ```swift
    /// event.creationSite?.file   // "App/Orders.swift"
    /// ```
    public let file: StaticString
    /// The line of the call.
    ///
    /// ```swift
    /// event.creationSite?.line   // 12
    /// ```
    public let line: UInt

    /// `file:line`, as compilers print locations.
    ///
    /// ```swift
    /// print(event.creationSite!)   // App/Orders.swift:12
    /// ```
    public var description: String { "\(file):\(line)" }

    /// Two sites are equal when they name the same file and line.
    ///
    /// ```swift
    /// event.creationSite == expectedSite
    /// ```
    public static func == (lhs: PromiseCreationSite, rhs: PromiseCreationSite) -> Bool {
        lhs.line == rhs.line && lhs.file.description == rhs.file.description
    }
}

/// An event the library reports to the handler set with `PromiseDiagnostics.setHandler`.
///
/// ```swift
/// PromiseDiagnostics.setHandler { event in logger.warning("\(event)") }
/// // a Promise<Order> made at App/Orders.swift:12 was freed while pending, with observers
/// // waiting: they receive PromiseError.brokenPromise
/// ```
public struct PromiseDiagnostic: Sendable, CustomStringConvertible {
    /// What happened.
    ///
    /// ```swift
    /// switch event.kind {
    /// case .brokenPromise: metrics.increment("promise.broken")
    /// case .unhandledRejection(let error): logger.error("unhandled: \(error)")
    /// case .cycle: metrics.increment("promise.cycle")
    /// }
    /// ```
    public enum Kind: Sendable {
        /// A promise was freed pending while observers waited for it; they received
        /// `PromiseError.brokenPromise` instead of waiting for ever.
        ///
        /// ```swift
        /// do { let dropped = Promise<Int>(); kept = dropped.then { $0 } }   // reported
        /// ```
        ///
        /// (`kept` now holds that error; freed unread, it is reported as well, as an
        /// `unhandledRejection`.)
        ///
        /// Reported too, once, for a promise whose handler, or `Promise(on:_:)` work, its
        /// context let go of unrun (an executor shut down, an `OperationQueue` whose
        /// operations were cancelled): it rejects with `PromiseError.brokenPromise`, and
        /// the event's sentence says so; that rejection is not reported again as unhandled.
        case brokenPromise
        /// A rejected promise was freed before any observer saw its error (no `catch`,
        /// `recover`, `whenComplete`, `await`, `wait`, child or combinator read it, nor
        /// stopped waiting for it first: a child cancelled or settled by its holder, a
        /// `timeout` child that timed out): the error, which would otherwise vanish. A
        /// cancelled promise is never reported.
        ///
        /// ```swift
        /// do { _ = Promise<Int>(error: BackendError.unavailable) }   // reported, with the error
        /// ```
        case unhandledRejection(any Error)
        /// A promise would have followed itself through a chain of promises; the promises
        /// of the cycle reject with `PromiseError.cycle`. Reported for the promise whose
        /// lock-in closed the cycle, once; the others adopt the error unreported. Two
        /// lock-ins closing one cycle at the same instant, on two threads, may each see
        /// it: both promises then reject themselves, and each is reported.
        ///
        /// ```swift
        /// a.resolve(with: b); b.resolve(with: a)   // reported once, for b
        /// ```
        ///
        /// (Like any rejection, a promise of the cycle freed with its `cycle` error
        /// unread is reported as an `unhandledRejection` as well.)
        case cycle
    }

    /// What happened.
    ///
    /// ```swift
    /// if case .unhandledRejection(let error) = event.kind { metrics.increment("unhandled") }
    /// ```
    public let kind: Kind
    /// The promise's type, as `Promise<Order>`.
    ///
    /// ```swift
    /// event.promiseType   // "Promise<Order>"
    /// ```
    public let promiseType: String
    /// Where the promise was made, in debug builds of the library; nil in release builds
    /// and for promises made by continuations and combinators.
    ///
    /// ```swift
    /// if let site = event.creationSite { print("made at \(site)") }
    /// ```
    public let creationSite: PromiseCreationSite?
    /// For `.brokenPromise`: the promise was not freed, its context let go of its work.
    let workDropped: Bool

    /// The event as a sentence, for a log line.
    ///
    /// ```swift
    /// print(event)
    /// // a Promise<Int> made at App/Orders.swift:12 was rejected and freed without any
    /// // observer seeing its error: the backend answered 503
    /// ```
    public var description: String {
        let promise = "a \(promiseType)" + (creationSite.map { " made at \($0)" } ?? "")
        switch kind {
        case .brokenPromise where workDropped:
            return "\(promise) lost its work: the context it was handed to let go of it unrun, so it rejects with PromiseError.brokenPromise"
        case .brokenPromise:
            return "\(promise) was freed while pending, with observers waiting: they receive PromiseError.brokenPromise"
        case .unhandledRejection(let error):
            return "\(promise) was rejected and freed without any observer seeing its error: \(error)"
        case .cycle:
            return "\(promise) would wait on itself through the promises it follows: they reject with PromiseError.cycle"
        }
    }
}

/// The one diagnostics hook: off until the application sets a handler.
///
/// ```swift
/// PromiseDiagnostics.setHandler { event in
///     logger.warning("\(event)")            // a sentence, with the creation site in debug builds
/// }
/// ```
///
/// Set it at start-up, before the promises it should watch are made. The handler runs on
/// the thread where the event happens (the thread that dropped the promise's last
/// reference, or closed the cycle), synchronously: keep it short and non-blocking, and
/// do not settle or observe promises from it. An event is reported once: a promise dies
/// once.
public enum PromiseDiagnostics {
    /// Installs `handler` for every event from now on, replacing the one before; nil
    /// turns reporting off.
    ///
    /// ```swift
    /// PromiseDiagnostics.setHandler(nil)   // off again
    /// ```
    public static func setHandler(_ handler: (@Sendable (PromiseDiagnostic) -> Void)?) {
        let installed = handler.map { UInt(bitPattern: Unmanaged.passRetained(Handler($0)).toOpaque()) } ?? 0
        var replaced: UInt = 0
        DiagnosticsHandlerWord.update { current in
            replaced = current
            return installed
        }
        // After the unlock: a reporter retains the handler under the lock, so none can
        // still be taking this one.
        if let box = UnsafeRawPointer(bitPattern: replaced) { Unmanaged<Handler>.fromOpaque(box).release() }
    }

    /// Whether a handler is set (one load): for a report that costs something to decide.
    static var isEnabled: Bool { DiagnosticsHandlerWord.isSet }

    /// Reports `kind` for `promise`, if a handler is set; `workDropped` for a
    /// `.brokenPromise` whose context let go of its work (see `PromiseDiagnostic.Kind`).
    static func report(_ kind: PromiseDiagnostic.Kind, for promise: AnyPromise, workDropped: Bool = false) {
        guard isEnabled, let handler = currentHandler() else { return }
        handler.body(PromiseDiagnostic(kind: kind, promiseType: promise.typeName,
                                       creationSite: promise.creationSiteIfRecorded, workDropped: workDropped))
    }

    private static func currentHandler() -> Handler? {
        var handler: Handler?
        DiagnosticsHandlerWord.update { current in
            if let box = UnsafeRawPointer(bitPattern: current) {
                handler = Unmanaged<Handler>.fromOpaque(box).takeUnretainedValue()  // retained by the copy
            }
            return current
        }
        return handler
    }

    private final class Handler: Sendable {
        let body: @Sendable (PromiseDiagnostic) -> Void
        init(_ body: @escaping @Sendable (PromiseDiagnostic) -> Void) { self.body = body }
    }
}

extension AnyPromise {
    /// An observer read this rejected promise's error: it is not an unhandled rejection.
    /// One load once marked; the first marks with one atomic OR (failures only).
    @usableFromInline
    final func noteErrorSeen() {
        if treeFlags & TreeFlag.errorSeen == 0 { _ = setTreeFlag(TreeFlag.errorSeen) }
    }

    /// `noteErrorSeen` if this promise has rejected (the outcome is read, or let go of
    /// unread by an observer that stopped waiting, which counts the same).
    final func noteErrorSeenIfRejected() {
        if publishedTag == UInt(PC_REJECTED) { noteErrorSeen() }
    }

    /// Whether an observer read this promise's error (see `noteErrorSeen`).
    final var errorWasSeen: Bool { treeFlags & TreeFlag.errorSeen != 0 }

    /// Records where the promise was made, in debug builds of the library; nothing in
    /// release builds, where an inlined initialiser then passes nothing either.
    @inlinable @inline(__always)
    final func noteCreationSite(file: StaticString, line: UInt) {
        #if DEBUG
        recordCreationSite(file: file, line: line)
        #endif
    }

    /// The creation site, if this build recorded one.
    final var creationSiteIfRecorded: PromiseCreationSite? {
        #if DEBUG
        return creationSite
        #else
        return nil
        #endif
    }
}
