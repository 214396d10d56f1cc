import CPromiseCore

/// A handler stored in the child promise it settles: a closure built by the inlinable
/// continuation methods, so its code is specialised for the caller's types (no generic
/// metadata lookups, no value witness calls on the fire path). It captures the user's
/// closure: registering a continuation costs the child promise and this context.
@usableFromInline
struct Continuation: Sendable {
    /// Runs the handler on `source`'s published outcome and settles `target`. When
    /// `source` was cancelled, `target` is already cancelled: only the error side runs.
    @usableFromInline let run: @Sendable (_ source: AnyPromise, _ target: AnyPromise) -> Void
    /// True if the handler has an error side, which also runs (for clean-up) when the
    /// parent was cancelled.
    @usableFromInline let hasErrorSide: Bool

    @inlinable
    init(hasErrorSide: Bool, _ run: @escaping @Sendable (_ source: AnyPromise, _ target: AnyPromise) -> Void) {
        self.run = run
        self.hasErrorSide = hasErrorSide
    }
}

/// The parent's published outcome, read without building a generic enum.
extension AnyPromise {
    @inlinable
    final func fulfilledValue<T: Sendable>(as type: T.Type) -> T? {
        publishedTag == UInt(PC_FULFILLED) ? unsafeDowncast(self, to: Promise<T>.self).storedValue : nil
    }

    /// The error of a rejected promise (nil if fulfilled or cancelled).
    @inlinable
    final var rejection: (any Error)? {
        publishedTag == UInt(PC_REJECTED) ? failure : nil
    }

    /// The reason of a cancelled promise (nil otherwise).
    @inlinable
    final var cancellationReason: (any Error)? {
        publishedTag == UInt(PC_CANCELLED) ? (failure ?? CancellationError()) : nil
    }
}

extension Promise {
    /// Follows `promise` when a handler returned it; rejects if the handler threw.
    @inlinable
    func settleFollowing(_ body: () throws -> Promise<Value>) {
        do {
            follow(try body())
        } catch {
            rejectFromHandler(error)
        }
    }
}

// The handlers, one builder each. `T` is the parent's value type, `U` the child's.
extension Continuation {
    @inlinable
    static func map<T: Sendable, U: Sendable>(_ body: @escaping @Sendable (T) throws -> U) -> Continuation {
        Continuation(hasErrorSide: false) { source, target in
            let child = unsafeDowncast(target, to: Promise<U>.self)
            if let value = source.fulfilledValue(as: T.self) {
                child.settleFromHandler { try body(value) }
            } else if let error = source.rejection {
                child.rejectFromHandler(error)
            }
        }
    }

    @inlinable
    static func flatMap<T: Sendable, U: Sendable>(_ body: @escaping @Sendable (T) throws -> Promise<U>) -> Continuation {
        Continuation(hasErrorSide: false) { source, target in
            let child = unsafeDowncast(target, to: Promise<U>.self)
            if let value = source.fulfilledValue(as: T.self) {
                child.settleFollowing { try body(value) }
            } else if let error = source.rejection {
                child.rejectFromHandler(error)
            }
        }
    }

    /// RXPromise's `then(onFulfilled, onRejected)`.
    @inlinable
    static func both<T: Sendable, U: Sendable>(
        _ onFulfilled: @escaping @Sendable (T) throws -> U,
        _ onRejected: @escaping @Sendable (any Error) throws -> U
    ) -> Continuation {
        Continuation(hasErrorSide: true) { source, target in
            let child = unsafeDowncast(target, to: Promise<U>.self)
            if let value = source.fulfilledValue(as: T.self) {
                child.settleFromHandler { try onFulfilled(value) }
            } else if let error = source.rejection {
                child.settleFromHandler { try onRejected(error) }
            } else if let reason = source.cancellationReason {
                _ = try? onRejected(reason)
            }
        }
    }

    @inlinable
    static func recover<T: Sendable>(_ body: @escaping @Sendable (any Error) throws -> T) -> Continuation {
        Continuation(hasErrorSide: true) { source, target in
            let child = unsafeDowncast(target, to: Promise<T>.self)
            if let value = source.fulfilledValue(as: T.self) {
                child.fulfillFromHandler(value)
            } else if let error = source.rejection {
                child.settleFromHandler { try body(error) }
            } else if let reason = source.cancellationReason {
                _ = try? body(reason)
            }
        }
    }

    @inlinable
    static func flatRecover<T: Sendable>(_ body: @escaping @Sendable (any Error) throws -> Promise<T>) -> Continuation {
        Continuation(hasErrorSide: true) { source, target in
            let child = unsafeDowncast(target, to: Promise<T>.self)
            if let value = source.fulfilledValue(as: T.self) {
                child.fulfillFromHandler(value)
            } else if let error = source.rejection {
                child.settleFollowing { try body(error) }
            } else if let reason = source.cancellationReason {
                // Clean-up only: the child stays cancelled, and the work it would have
                // followed is cancelled with it.
                (try? body(reason))?.cancel(reason: reason)
            }
        }
    }

    @inlinable
    static func mapError<T: Sendable>(_ type: T.Type, _ body: @escaping @Sendable (any Error) -> any Error) -> Continuation {
        Continuation(hasErrorSide: true) { source, target in
            let child = unsafeDowncast(target, to: Promise<T>.self)
            if let value = source.fulfilledValue(as: T.self) {
                child.fulfillFromHandler(value)
            } else if let error = source.rejection {
                child.rejectFromHandler(body(error))
            } else if let reason = source.cancellationReason {
                _ = body(reason)
            }
        }
    }

    /// `catch`: an error side effect; the outcome passes on unchanged.
    @inlinable
    static func tapError<T: Sendable>(_ type: T.Type, _ body: @escaping @Sendable (any Error) -> Void) -> Continuation {
        Continuation(hasErrorSide: true) { source, target in
            let child = unsafeDowncast(target, to: Promise<T>.self)
            if let value = source.fulfilledValue(as: T.self) {
                child.fulfillFromHandler(value)
            } else if let error = source.rejection {
                body(error)
                child.rejectFromHandler(error)
            } else if let reason = source.cancellationReason {
                body(reason)
            }
        }
    }

    /// `always`: a side effect on any outcome; the outcome passes on unchanged.
    @inlinable
    static func always<T: Sendable>(_ type: T.Type, _ body: @escaping @Sendable () -> Void) -> Continuation {
        Continuation(hasErrorSide: true) { source, target in
            let child = unsafeDowncast(target, to: Promise<T>.self)
            body()
            if let value = source.fulfilledValue(as: T.self) {
                child.fulfillFromHandler(value)
            } else if let error = source.rejection {
                child.rejectFromHandler(error)
            }
        }
    }

    @inlinable
    static func validate<T: Sendable>(_ predicate: @escaping @Sendable (T) throws -> Bool) -> Continuation {
        Continuation(hasErrorSide: false) { source, target in
            let child = unsafeDowncast(target, to: Promise<T>.self)
            if let value = source.fulfilledValue(as: T.self) {
                child.settleFromHandler {
                    guard try predicate(value) else { throw PromiseError.validationFailure }
                    return value
                }
            } else if let error = source.rejection {
                child.rejectFromHandler(error)
            }
        }
    }
}
