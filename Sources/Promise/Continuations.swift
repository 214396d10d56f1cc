import CPromiseCore

/// A handler stored in the child promise it settles. Each conforming struct holds just
/// the user's closure(s), so it fits the existential's inline buffer: registering a
/// continuation costs the child promise and the closure's own context, nothing else.
@usableFromInline
protocol PromiseContinuation: Sendable {
    /// True if the handler has an error side, which also runs (for clean-up) when the
    /// parent was cancelled.
    var hasErrorSide: Bool { get }

    /// Runs the handler on `source`'s published outcome and settles `target`. When
    /// `source` was cancelled, `target` is already cancelled: only the error side runs.
    func run(source: AnyPromise, target: AnyPromise)
}

/// The parent's outcome, read after it was published.
@usableFromInline
enum Outcome<Value: Sendable> {
    case fulfilled(Value)
    case rejected(any Error)
    case cancelled(any Error)

    @inlinable
    init(of source: AnyPromise) {
        let promise = unsafeDowncast(source, to: Promise<Value>.self)
        switch promise.publishedTag {
        case UInt(PC_FULFILLED): self = .fulfilled(promise.fulfilledValue.unsafelyUnwrapped)
        case UInt(PC_REJECTED): self = .rejected(promise.failure.unsafelyUnwrapped)
        default: self = .cancelled(promise.failure ?? CancellationError())
        }
    }
}

extension Promise {
    /// Follows `promise` when a handler returned it; rejects if the handler threw.
    @inlinable
    func settleFollowing(_ body: () throws -> Promise<Value>) {
        do {
            follow(try body())
        } catch {
            reject(error)
        }
    }
}

@usableFromInline
struct MapContinuation<T: Sendable, U: Sendable>: PromiseContinuation {
    @usableFromInline let body: @Sendable (T) throws -> U
    @inlinable init(_ body: @escaping @Sendable (T) throws -> U) { self.body = body }
    @inlinable var hasErrorSide: Bool { false }

    @inlinable
    func run(source: AnyPromise, target: AnyPromise) {
        let child = unsafeDowncast(target, to: Promise<U>.self)
        switch Outcome<T>(of: source) {
        case .fulfilled(let value): child.settle { try body(value) }
        case .rejected(let error): child.reject(error)
        case .cancelled: break
        }
    }
}

@usableFromInline
struct FlatMapContinuation<T: Sendable, U: Sendable>: PromiseContinuation {
    @usableFromInline let body: @Sendable (T) throws -> Promise<U>
    @inlinable init(_ body: @escaping @Sendable (T) throws -> Promise<U>) { self.body = body }
    @inlinable var hasErrorSide: Bool { false }

    @inlinable
    func run(source: AnyPromise, target: AnyPromise) {
        let child = unsafeDowncast(target, to: Promise<U>.self)
        switch Outcome<T>(of: source) {
        case .fulfilled(let value): child.settleFollowing { try body(value) }
        case .rejected(let error): child.reject(error)
        case .cancelled: break
        }
    }
}

/// RXPromise's `then(onFulfilled, onRejected)`.
@usableFromInline
struct BothContinuation<T: Sendable, U: Sendable>: PromiseContinuation {
    @usableFromInline let onFulfilled: @Sendable (T) throws -> U
    @usableFromInline let onRejected: @Sendable (any Error) throws -> U
    @inlinable init(_ onFulfilled: @escaping @Sendable (T) throws -> U,
                    _ onRejected: @escaping @Sendable (any Error) throws -> U) {
        self.onFulfilled = onFulfilled
        self.onRejected = onRejected
    }
    @inlinable var hasErrorSide: Bool { true }

    @inlinable
    func run(source: AnyPromise, target: AnyPromise) {
        let child = unsafeDowncast(target, to: Promise<U>.self)
        switch Outcome<T>(of: source) {
        case .fulfilled(let value): child.settle { try onFulfilled(value) }
        case .rejected(let error): child.settle { try onRejected(error) }
        case .cancelled(let reason): _ = try? onRejected(reason)
        }
    }
}

@usableFromInline
struct RecoverContinuation<T: Sendable>: PromiseContinuation {
    @usableFromInline let body: @Sendable (any Error) throws -> T
    @inlinable init(_ body: @escaping @Sendable (any Error) throws -> T) { self.body = body }
    @inlinable var hasErrorSide: Bool { true }

    @inlinable
    func run(source: AnyPromise, target: AnyPromise) {
        let child = unsafeDowncast(target, to: Promise<T>.self)
        switch Outcome<T>(of: source) {
        case .fulfilled(let value): child.fulfill(value)
        case .rejected(let error): child.settle { try body(error) }
        case .cancelled(let reason): _ = try? body(reason)
        }
    }
}

@usableFromInline
struct FlatRecoverContinuation<T: Sendable>: PromiseContinuation {
    @usableFromInline let body: @Sendable (any Error) throws -> Promise<T>
    @inlinable init(_ body: @escaping @Sendable (any Error) throws -> Promise<T>) { self.body = body }
    @inlinable var hasErrorSide: Bool { true }

    @inlinable
    func run(source: AnyPromise, target: AnyPromise) {
        let child = unsafeDowncast(target, to: Promise<T>.self)
        switch Outcome<T>(of: source) {
        case .fulfilled(let value): child.fulfill(value)
        case .rejected(let error): child.settleFollowing { try body(error) }
        case .cancelled(let reason):
            // Clean-up only: the child stays cancelled, and the work it would have
            // followed is cancelled with it.
            (try? body(reason))?.cancel(reason: reason)
        }
    }
}

@usableFromInline
struct MapErrorContinuation<T: Sendable>: PromiseContinuation {
    @usableFromInline let body: @Sendable (any Error) -> any Error
    @inlinable init(_ body: @escaping @Sendable (any Error) -> any Error) { self.body = body }
    @inlinable var hasErrorSide: Bool { true }

    @inlinable
    func run(source: AnyPromise, target: AnyPromise) {
        let child = unsafeDowncast(target, to: Promise<T>.self)
        switch Outcome<T>(of: source) {
        case .fulfilled(let value): child.fulfill(value)
        case .rejected(let error): child.reject(body(error))
        case .cancelled(let reason): _ = body(reason)
        }
    }
}

/// `catch`: an error side effect; the outcome passes on unchanged.
@usableFromInline
struct CatchContinuation<T: Sendable>: PromiseContinuation {
    @usableFromInline let body: @Sendable (any Error) -> Void
    @inlinable init(_ body: @escaping @Sendable (any Error) -> Void) { self.body = body }
    @inlinable var hasErrorSide: Bool { true }

    @inlinable
    func run(source: AnyPromise, target: AnyPromise) {
        let child = unsafeDowncast(target, to: Promise<T>.self)
        switch Outcome<T>(of: source) {
        case .fulfilled(let value): child.fulfill(value)
        case .rejected(let error):
            body(error)
            child.reject(error)
        case .cancelled(let reason): body(reason)
        }
    }
}

/// `always`: a side effect on any outcome; the outcome passes on unchanged.
@usableFromInline
struct AlwaysContinuation<T: Sendable>: PromiseContinuation {
    @usableFromInline let body: @Sendable () -> Void
    @inlinable init(_ body: @escaping @Sendable () -> Void) { self.body = body }
    @inlinable var hasErrorSide: Bool { true }

    @inlinable
    func run(source: AnyPromise, target: AnyPromise) {
        let child = unsafeDowncast(target, to: Promise<T>.self)
        body()
        switch Outcome<T>(of: source) {
        case .fulfilled(let value): child.fulfill(value)
        case .rejected(let error): child.reject(error)
        case .cancelled: break
        }
    }
}

@usableFromInline
struct ValidateContinuation<T: Sendable>: PromiseContinuation {
    @usableFromInline let predicate: @Sendable (T) throws -> Bool
    @inlinable init(_ predicate: @escaping @Sendable (T) throws -> Bool) { self.predicate = predicate }
    @inlinable var hasErrorSide: Bool { false }

    @inlinable
    func run(source: AnyPromise, target: AnyPromise) {
        let child = unsafeDowncast(target, to: Promise<T>.self)
        switch Outcome<T>(of: source) {
        case .fulfilled(let value):
            child.settle {
                guard try predicate(value) else { throw PromiseError.validationFailure }
                return value
            }
        case .rejected(let error): child.reject(error)
        case .cancelled: break
        }
    }
}
