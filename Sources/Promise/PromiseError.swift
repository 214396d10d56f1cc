/// Errors the library itself produces.
public enum PromiseError: Error, Sendable {
    /// `wait(timeout:)` or `timeout(_:)` ran out of time.
    case timedOut
    /// A `validate` predicate returned false.
    case validationFailure
    /// Every input of `Promise.any` was rejected; the errors are in input order.
    case allRejected([any Error])
}
