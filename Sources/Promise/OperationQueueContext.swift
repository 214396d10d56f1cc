// OperationQueue as a context: compiled only with the package trait `Foundation` (on by
// default). A statically linked server that turns the trait off links no Foundation: see
// Package.swift and the README's "Add it to your package".
#if Foundation
import Foundation

/// An `OperationQueue` runs each handler as an operation; its `maxConcurrentOperationCount`
/// decides whether handlers may overlap.
///
/// Available with the package trait `Foundation`, which is on by default.
extension OperationQueue: ExecutionContext {
    /// Adds `work` to the queue as a block operation.
    public func execute(_ work: @escaping @Sendable () -> Void) {
        addOperation(work)
    }
}
#endif
