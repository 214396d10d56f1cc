import CPromiseCore

/// A handler stored in the child promise it settles, without a box around it: the user's
/// closure itself sits in `slot` (a closure is two words, its function and its context),
/// and `invoke`, built by the inlinable continuation methods, knows the closure's type.
///
/// Why not a closure that captures the user's closure (the obvious design): the captured
/// closure is two words, so every capturing handler would cost a context allocation of
/// its own on top of the child promise. Here a handler that captures at most one class
/// reference (whose context is that object itself) or nothing costs no allocation:
/// `then` is the child promise alone.
///
/// `invoke` captures nothing once specialised in the caller (the builders are
/// `@inlinable`), so it is a function pointer with no context and its code knows `T` and
/// `U`: no metadata lookups or value witness calls on the fire path. Unspecialised
/// (debug builds, generic callers) it captures the type metadata it needs, and still works.
///
/// Ownership: the handler in `slot` is owned by this value, which is noncopyable so that
/// it is moved out exactly once, by `run` (the handler is released when it returns: a
/// handler is consumed when it runs), or released by `deinit` if it never runs.
@usableFromInline
struct StoredHandler: ~Copyable, Sendable {
    /// What `invoke` does: moves the handler out of `slot` (as the type it was stored as)
    /// and, given both promises, runs it on `source`'s published outcome to settle
    /// `target`; given nil, only releases it.
    @usableFromInline
    typealias Invoke = @Sendable (_ slot: UnsafeMutableRawPointer, _ source: AnyPromise?, _ target: AnyPromise?) -> Void

    /// The user's handler, untyped; all zero once moved out.
    @usableFromInline var slot: (UInt, UInt)
    /// Knows the handler's type: see `Invoke`.
    @usableFromInline let invoke: Invoke
    /// True if the handler has an error side, which also runs (for clean-up) when the
    /// parent was cancelled.
    @usableFromInline let hasErrorSide: Bool
    /// False for the handlers that only run on an error (`recover`, `mapError`, `catch`):
    /// a fulfilled parent's value passes through them untouched.
    @usableFromInline let hasSuccessSide: Bool

    /// Stores `handler` in the slot. `invoke` must move it out as `Handler` (the builders
    /// spell the type once, as a local `Body` typealias, for both sides).
    @inlinable
    init<Handler>(storing handler: Handler, as type: Handler.Type, hasErrorSide: Bool, hasSuccessSide: Bool = true,
                  _ invoke: @escaping Invoke) {
        // Closures and class references, two words at most: constant-folded once specialised.
        precondition(MemoryLayout<Handler>.size <= MemoryLayout<(UInt, UInt)>.size
                     && MemoryLayout<Handler>.alignment <= MemoryLayout<(UInt, UInt)>.alignment)
        slot = (0, 0)
        self.invoke = invoke
        self.hasErrorSide = hasErrorSide
        self.hasSuccessSide = hasSuccessSide
        withUnsafeMutableBytes(of: &slot) { _ = $0.baseAddress.unsafelyUnwrapped.initializeMemory(as: Handler.self, to: handler) }
    }

    /// Whether the handler runs user code for an outcome of its parent (`tag`); when not,
    /// it only passes that outcome through (`then` on a rejected parent, `recover` on a
    /// fulfilled one). A cancelled parent counts as running it: its error side, if any,
    /// runs for clean-up.
    func runsUserCode(forParentOutcome tag: UInt) -> Bool {
        switch tag {
        case UInt(PC_FULFILLED): return hasSuccessSide
        case UInt(PC_REJECTED): return hasErrorSide
        default: return true
        }
    }

    /// Moves the handler out of the `slot` that `invoke` received, as the type it was stored as.
    @inlinable
    static func take<Handler>(_ type: Handler.Type, from slot: UnsafeMutableRawPointer) -> Handler {
        slot.assumingMemoryBound(to: Handler.self).move()
    }

    /// Runs the handler on `source`'s published outcome and settles `target`. When
    /// `source` was cancelled, `target` is already cancelled: only the error side runs.
    /// The handler is released before this returns.
    consuming func run(_ source: AnyPromise, _ target: AnyPromise) {
        var handler = slot
        slot = (0, 0)  // moved out: `deinit`, at the end of this call, finds nothing to release
        withUnsafeMutableBytes(of: &handler) { invoke($0.baseAddress.unsafelyUnwrapped, source, target) }
    }

    deinit {
        // A handler that never ran: its child died first, or was settled by someone else.
        // A stored handler (a closure's function pointer, a class reference) is never all zero.
        guard slot.0 != 0 || slot.1 != 0 else { return }
        var handler = slot
        withUnsafeMutableBytes(of: &handler) { invoke($0.baseAddress.unsafelyUnwrapped, nil, nil) }
    }
}

/// The two handlers of `then(_:_:)`: four words, too many for the slot, so they share one
/// box (the one allocation a two-handler `then` costs besides the child).
@usableFromInline
final class HandlerPair<T: Sendable, U: Sendable>: Sendable {
    @usableFromInline let onFulfilled: @Sendable (T) throws -> U
    @usableFromInline let onRejected: @Sendable (any Error) throws -> U

    @inlinable
    init(_ onFulfilled: @escaping @Sendable (T) throws -> U, _ onRejected: @escaping @Sendable (any Error) throws -> U) {
        self.onFulfilled = onFulfilled
        self.onRejected = onRejected
    }
}

extension Promise {
    /// Follows `promise` when a handler returned it; rejects if the handler threw.
    @inlinable
    func settleFollowing(parent: AnyPromise, _ body: () throws -> Promise<Value>) {
        do {
            follow(try body(), parent: parent)
        } catch {
            rejectFromHandler(error, parent: parent)
        }
    }
}

// The handlers, one builder each. `T` is the parent's value type, `U` the child's. Each
// stores the user's closure as `Body` and its `invoke` takes it back as `Body`; `invoke`
// reaches nothing but its arguments (a capture would cost an allocation per `then`), which
// is also why each builder spells out the same few unwrapping lines instead of passing its
// step to a shared helper as a closure: `invoke` would have to capture that closure.
// The promises are unwrapped with a nil check and `unsafelyUnwrapped`, not `guard let`:
// the optimiser turns `guard let` bindings of the optional parameters into owned copies,
// a retain and a release of each promise around the (opaque) handler call, which on
// promises with a side table take the runtime's slow path.
extension StoredHandler {
    /// `whenComplete` kept in a root's first-observer slot: hands the outcome to `body`.
    /// (`target` is the same promise; nothing is settled.)
    @inlinable
    static func completion<T: Sendable>(_ type: T.Type, _ body: @escaping @Sendable (Result<T, any Error>) -> Void) -> StoredHandler {
        typealias Body = @Sendable (Result<T, any Error>) -> Void
        return StoredHandler(storing: body, as: Body.self, hasErrorSide: true) { slot, source, _ in
            let body = StoredHandler.take(Body.self, from: slot)
            guard source != nil else { return }  // only releasing it
            body(unsafeDowncast(source.unsafelyUnwrapped, to: Promise<T>.self).publishedResult)
        }
    }

    @inlinable
    static func map<T: Sendable, U: Sendable>(_ body: @escaping @Sendable (T) throws -> U) -> StoredHandler {
        typealias Body = @Sendable (T) throws -> U
        return StoredHandler(storing: body, as: Body.self, hasErrorSide: false) { slot, source, target in
            let body = StoredHandler.take(Body.self, from: slot)
            guard source != nil else { return }  // only releasing it
            let source = source.unsafelyUnwrapped, target = target.unsafelyUnwrapped
            let child = unsafeDowncast(target, to: Promise<U>.self)
            if let value = source.fulfilledValue(as: T.self) {
                child.settleFromHandler(parent: source) { try body(value) }
            } else if let error = source.rejection {
                child.rejectFromHandler(error, parent: source)
            }
        }
    }

    @inlinable
    static func flatMap<T: Sendable, U: Sendable>(_ body: @escaping @Sendable (T) throws -> Promise<U>) -> StoredHandler {
        typealias Body = @Sendable (T) throws -> Promise<U>
        return StoredHandler(storing: body, as: Body.self, hasErrorSide: false) { slot, source, target in
            let body = StoredHandler.take(Body.self, from: slot)
            guard source != nil else { return }  // only releasing it
            let source = source.unsafelyUnwrapped, target = target.unsafelyUnwrapped
            let child = unsafeDowncast(target, to: Promise<U>.self)
            if let value = source.fulfilledValue(as: T.self) {
                child.settleFollowing(parent: source) { try body(value) }
            } else if let error = source.rejection {
                child.rejectFromHandler(error, parent: source)
            }
        }
    }

    /// A handler that settles its child later, itself (`delay`): given the parent's value
    /// and the child, it arranges for the child to be settled; a rejection passes on at
    /// once. The child stays an ordinary pending promise meanwhile, not locked in: its
    /// holder may still settle it, and it is linked into its parent's cancellation
    /// registry, so a cancel forwarded through the parent still reaches it.
    @inlinable
    static func handOff<T: Sendable>(_ body: @escaping @Sendable (T, Promise<T>) -> Void) -> StoredHandler {
        typealias Body = @Sendable (T, Promise<T>) -> Void
        return StoredHandler(storing: body, as: Body.self, hasErrorSide: false) { slot, source, target in
            let body = StoredHandler.take(Body.self, from: slot)
            guard source != nil else { return }  // only releasing it
            let source = source.unsafelyUnwrapped, target = target.unsafelyUnwrapped
            let child = unsafeDowncast(target, to: Promise<T>.self)
            if let value = source.fulfilledValue(as: T.self) {
                child.stayInFlight(parent: source)
                body(value, child)
            } else if let error = source.rejection {
                child.rejectFromHandler(error, parent: source)
            }
        }
    }

    /// RXPromise's `then(onFulfilled, onRejected)`.
    @inlinable
    static func both<T: Sendable, U: Sendable>(
        _ onFulfilled: @escaping @Sendable (T) throws -> U,
        _ onRejected: @escaping @Sendable (any Error) throws -> U
    ) -> StoredHandler {
        typealias Body = HandlerPair<T, U>
        return StoredHandler(storing: Body(onFulfilled, onRejected), as: Body.self,
                            hasErrorSide: true) { slot, source, target in
            let handlers = StoredHandler.take(Body.self, from: slot)
            guard source != nil else { return }  // only releasing it
            let source = source.unsafelyUnwrapped, target = target.unsafelyUnwrapped
            let child = unsafeDowncast(target, to: Promise<U>.self)
            if let value = source.fulfilledValue(as: T.self) {
                child.settleFromHandler(parent: source) { try handlers.onFulfilled(value) }
            } else if let error = source.rejection {
                child.settleFromHandler(parent: source) { try handlers.onRejected(error) }
            } else if let reason = source.cancellationReason {
                _ = try? handlers.onRejected(reason)
            }
        }
    }

    @inlinable
    static func recover<T: Sendable>(_ body: @escaping @Sendable (any Error) throws -> T) -> StoredHandler {
        typealias Body = @Sendable (any Error) throws -> T
        return StoredHandler(storing: body, as: Body.self, hasErrorSide: true, hasSuccessSide: false) { slot, source, target in
            let body = StoredHandler.take(Body.self, from: slot)
            guard source != nil else { return }  // only releasing it
            let source = source.unsafelyUnwrapped, target = target.unsafelyUnwrapped
            let child = unsafeDowncast(target, to: Promise<T>.self)
            if let value = source.fulfilledValue(as: T.self) {
                child.fulfillFromHandler(value, parent: source)
            } else if let error = source.rejection {
                child.settleFromHandler(parent: source) { try body(error) }
            } else if let reason = source.cancellationReason {
                _ = try? body(reason)
            }
        }
    }

    @inlinable
    static func flatRecover<T: Sendable>(_ body: @escaping @Sendable (any Error) throws -> Promise<T>) -> StoredHandler {
        typealias Body = @Sendable (any Error) throws -> Promise<T>
        return StoredHandler(storing: body, as: Body.self, hasErrorSide: true, hasSuccessSide: false) { slot, source, target in
            let body = StoredHandler.take(Body.self, from: slot)
            guard source != nil else { return }  // only releasing it
            let source = source.unsafelyUnwrapped, target = target.unsafelyUnwrapped
            let child = unsafeDowncast(target, to: Promise<T>.self)
            if let value = source.fulfilledValue(as: T.self) {
                child.fulfillFromHandler(value, parent: source)
            } else if let error = source.rejection {
                child.settleFollowing(parent: source) { try body(error) }
            } else if let reason = source.cancellationReason {
                // Clean-up only: the child stays cancelled, and the work it would have
                // followed is cancelled with it.
                (try? body(reason))?.cancelOwnedWork(reason: reason)
            }
        }
    }

    @inlinable
    static func mapError<T: Sendable>(_ type: T.Type, _ body: @escaping @Sendable (any Error) -> any Error) -> StoredHandler {
        typealias Body = @Sendable (any Error) -> any Error
        return StoredHandler(storing: body, as: Body.self, hasErrorSide: true, hasSuccessSide: false) { slot, source, target in
            let body = StoredHandler.take(Body.self, from: slot)
            guard source != nil else { return }  // only releasing it
            let source = source.unsafelyUnwrapped, target = target.unsafelyUnwrapped
            let child = unsafeDowncast(target, to: Promise<T>.self)
            if let value = source.fulfilledValue(as: T.self) {
                child.fulfillFromHandler(value, parent: source)
            } else if let error = source.rejection {
                child.rejectFromHandler(body(error), parent: source)
            } else if let reason = source.cancellationReason {
                _ = body(reason)
            }
        }
    }

    /// `catch`: an error side effect; the outcome passes on unchanged.
    @inlinable
    static func tapError<T: Sendable>(_ type: T.Type, _ body: @escaping @Sendable (any Error) -> Void) -> StoredHandler {
        typealias Body = @Sendable (any Error) -> Void
        return StoredHandler(storing: body, as: Body.self, hasErrorSide: true, hasSuccessSide: false) { slot, source, target in
            let body = StoredHandler.take(Body.self, from: slot)
            guard source != nil else { return }  // only releasing it
            let source = source.unsafelyUnwrapped, target = target.unsafelyUnwrapped
            let child = unsafeDowncast(target, to: Promise<T>.self)
            if let value = source.fulfilledValue(as: T.self) {
                child.fulfillFromHandler(value, parent: source)
            } else if let error = source.rejection {
                body(error)
                // `body` read the error the child passes on: a fire-and-forget `catch`
                // handled it (no unhandled rejection for the child it returns). Only if
                // the child took that error: settled otherwise first, its error is news.
                if child.rejectFromHandler(error, parent: source) { child.noteErrorSeen() }
            } else if let reason = source.cancellationReason {
                body(reason)
            }
        }
    }

    /// `always`: a side effect on any outcome; the outcome passes on unchanged. Without an
    /// error side, a cancel of the parent does not run `body` (for a `body` that does
    /// nothing: `passOn(on:)`).
    @inlinable
    static func always<T: Sendable>(_ type: T.Type, hasErrorSide: Bool = true,
                                    _ body: @escaping @Sendable () -> Void) -> StoredHandler {
        typealias Body = @Sendable () -> Void
        return StoredHandler(storing: body, as: Body.self, hasErrorSide: hasErrorSide) { slot, source, target in
            let body = StoredHandler.take(Body.self, from: slot)
            guard source != nil else { return }  // only releasing it
            let source = source.unsafelyUnwrapped, target = target.unsafelyUnwrapped
            let child = unsafeDowncast(target, to: Promise<T>.self)
            body()
            if let value = source.fulfilledValue(as: T.self) {
                child.fulfillFromHandler(value, parent: source)
            } else if let error = source.rejection {
                child.rejectFromHandler(error, parent: source)
            }
        }
    }

    @inlinable
    static func validate<T: Sendable>(_ predicate: @escaping @Sendable (T) throws -> Bool) -> StoredHandler {
        typealias Body = @Sendable (T) throws -> Bool
        return StoredHandler(storing: predicate, as: Body.self, hasErrorSide: false) { slot, source, target in
            let predicate = StoredHandler.take(Body.self, from: slot)
            guard source != nil else { return }  // only releasing it
            let source = source.unsafelyUnwrapped, target = target.unsafelyUnwrapped
            let child = unsafeDowncast(target, to: Promise<T>.self)
            if let value = source.fulfilledValue(as: T.self) {
                child.settleFromHandler(parent: source) {
                    guard try predicate(value) else { throw PromiseError.validationFailure }
                    return value
                }
            } else if let error = source.rejection {
                child.rejectFromHandler(error, parent: source)
            }
        }
    }
}
