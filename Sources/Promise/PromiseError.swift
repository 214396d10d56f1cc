// Promise imports nothing of Foundation's family unless a package trait asks for it (see
// Package.swift). `Foundation`, on by default, brings `LocalizedError` with Foundation
// (which also gives `OperationQueue` its context conformance). `FoundationEssentials`
// brings `LocalizedError` alone, from FoundationEssentials, for a server that links it
// anyway (from Foundation on Apple's SDKs, which have no separate FoundationEssentials and
// whose Foundation is the system's, costing a binary nothing). With neither, as a
// statically linked server builds it, the errors still describe themselves
// (`CustomStringConvertible`, `errorDescription`); `LocalizedError` would cost such a
// binary about 11 MB of FoundationEssentials.
#if Foundation
import Foundation
#elseif FoundationEssentials && canImport(FoundationEssentials)
import FoundationEssentials
#elseif FoundationEssentials
import Foundation
#endif

/// Errors the library itself produces. Each describes itself in a sentence, for logs:
/// `String(describing:)`, `localizedDescription` and `errorDescription` all give it.
///
/// ```swift
/// do {
///     let config = try fetchConfig().timeout(.seconds(2)).wait()
/// } catch PromiseError.timedOut {
///     useDefaults()
/// } catch {
///     log.error("config: \(error.localizedDescription)")
/// }
/// ```
public enum PromiseError: Error, Sendable {
    /// `wait(timeout:)` or `timeout(_:)` ran out of time.
    ///
    /// It carries no duration: `PromiseError.timedOut` stays a value that code can throw
    /// and compare, which an associated value would rule out. The log line of a timeout
    /// is best written where the duration is known.
    case timedOut
    /// A `validate` predicate returned false.
    case validationFailure
    /// Every input of `Promise.any` was rejected; the errors are in input order.
    case allRejected([any Error])
    /// The promise this one waited for was freed before anyone settled it: its last reference
    /// went away while it was pending, so it never could be settled. Delivered to everything
    /// still waiting on it (children, observers, combinators, followers, and through them the
    /// `await`s and `wait()`s on what was derived from it; an `await` or `wait()` on the
    /// promise itself holds it, so it cannot die under them), as folly's `BrokenPromise`.
    /// Also the error of a promise whose work its context let go of unrun (an executor shut
    /// down: see `ExecutionContext`), which nothing else would settle.
    ///
    /// ```swift
    /// let name = lookup().then { $0.name }   // lookup's promise is dropped unsettled
    /// name.catch { if case PromiseError.brokenPromise = $0 { log("lookup never answered") } }
    /// ```
    case brokenPromise
    /// A promise would have waited on itself, directly (`p.resolve(with: p)`, a handler
    /// returning its own child), through a cycle of promises following each other
    /// (Promises/A+ 2.3.1), or through a combinator over itself that nothing else can
    /// settle (`p.resolve(with: Promise.all([p]).map { $0[0] })`), found within the
    /// cycle check's bounds (see `resolve(with:)`).
    ///
    /// ```swift
    /// let p = Promise<Int>()
    /// p.resolve(with: p)   // p rejects with PromiseError.cycle
    /// ```
    case cycle
    /// An argument was out of range, such as `Promise.retry(attempts: 0)`, or a clock
    /// given to a timer cannot time it (its `sleep` keeps returning before the deadline);
    /// the text says which and why.
    ///
    /// ```swift
    /// Promise<Int>.retry(attempts: 0) { fetch() }
    ///     .catch { print($0) }   // "invalid argument: Promise.retry needs at least one attempt, ..."
    /// ```
    case invalidArgument(String)
}

extension PromiseError: CustomStringConvertible {
    /// The error as a sentence, e.g. "every input was rejected (3 errors: ...)".
    ///
    /// ```swift
    /// print(PromiseError.brokenPromise)
    /// // the promise was dropped before it was settled
    /// ```
    public var description: String {
        switch self {
        case .timedOut:
            return "the promise timed out before it was settled"
        case .validationFailure:
            return "validation failed"
        case .allRejected(let errors):
            guard !errors.isEmpty else { return "every input was rejected (there were no inputs)" }
            let listed = errors.prefix(3).map { String(describing: $0) }.joined(separator: "; ")
            let more = errors.count > 3 ? "; and \(errors.count - 3) more" : ""
            return "every input was rejected (\(errors.count) error\(errors.count == 1 ? "" : "s"): \(listed)\(more))"
        case .brokenPromise:
            return "the promise was dropped before it was settled"
        case .cycle:
            return "the promise would wait on itself: it follows a chain of promises that leads back to it"
        case .invalidArgument(let explanation):
            return "invalid argument: \(explanation)"
        }
    }

    /// The same sentence as `description`, for `localizedDescription` and logging
    /// frameworks that read `LocalizedError`.
    ///
    /// ```swift
    /// let error: any Error = PromiseError.cycle
    /// logger.error("\(error.localizedDescription)")   // the sentence, not "error 4"
    /// ```
    public var errorDescription: String? { description }
}

/// The error `Promise.wrap` reports when a `(value?, error?)` callback gets neither.
public enum PromiseWrapError: Error, Sendable {
    /// The completion handler was called with `nil` for both the value and the error.
    case neitherValueNorError
}

extension PromiseWrapError: CustomStringConvertible {
    /// The error as a sentence, for logs.
    ///
    /// ```swift
    /// print(PromiseWrapError.neitherValueNorError)
    /// // the wrapped completion handler was called with neither a value nor an error
    /// ```
    public var description: String {
        switch self {
        case .neitherValueNorError:
            return "the wrapped completion handler was called with neither a value nor an error"
        }
    }

    /// The same sentence as `description`, for `localizedDescription`.
    ///
    /// ```swift
    /// let error: any Error = PromiseWrapError.neitherValueNorError
    /// print(error.localizedDescription)   // the sentence
    /// ```
    public var errorDescription: String? { description }
}

#if Foundation || FoundationEssentials
// `errorDescription` (above) is the witness: `localizedDescription` gives the sentence.
extension PromiseError: LocalizedError {}
extension PromiseWrapError: LocalizedError {}
#endif
