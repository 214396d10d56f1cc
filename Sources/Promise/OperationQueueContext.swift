// OperationQueue as a context: compiled only with the package trait `Foundation` (on by
// default). A statically linked server that turns the trait off links no Foundation: see
// Package.swift and the README's "Add it to your package".
#if Foundation
import Foundation

/// An `OperationQueue` runs each handler as an operation; its `maxConcurrentOperationCount`
/// decides whether handlers may overlap.
///
/// An operation the library added that is cancelled before it starts
/// (`cancelAllOperations()` at shutdown, say) never runs its block: the promise its handler
/// would have settled rejects with `PromiseError.brokenPromise` once the queue lets go of
/// the operation, so nobody waits on it for ever (a handler that would only have passed
/// its parent's outcome through, `then` on a rejected parent or `recover` on a fulfilled
/// one, passes it through instead). To stop work and say why, cancel the
/// promises instead: their handlers then do not run, and everything waiting on them
/// receives the cancel.
///
/// Available with the package trait `Foundation`, which is on by default.
extension OperationQueue: ExecutionContext {
    /// Adds `work` to the queue as a block operation.
    public func execute(_ work: @escaping @Sendable () -> Void) {
        addOperation(work)
    }
}
#endif
