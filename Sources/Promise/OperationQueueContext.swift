// OperationQueue as a context: compiled only with the package trait `Foundation` (on by
// default). A statically linked server that turns the trait off links no Foundation: see
// Package.swift and the README's "Add it to your package".
#if Foundation
import Foundation

/// An `OperationQueue` runs each handler as an operation; its `maxConcurrentOperationCount`
/// decides whether handlers may overlap.
///
/// Do not cancel the operations the library adds (`cancelAllOperations()` at shutdown, say):
/// an operation cancelled before it starts never runs its block, so the handler it carries
/// never settles its promise, and whoever waits on that promise while holding it waits for
/// ever (one nobody holds is reported broken once freed). To stop work, cancel the promises
/// instead: their handlers then do not run, and everything waiting on them is answered.
///
/// Available with the package trait `Foundation`, which is on by default.
extension OperationQueue: ExecutionContext {
    /// Adds `work` to the queue as a block operation.
    public func execute(_ work: @escaping @Sendable () -> Void) {
        addOperation(work)
    }
}
#endif
