import CPromiseCore

// Reading a settled promise's outcome: every reader in one place. The outcome is stored
// once by the claim winner (the value in the core's payload words, `storedValue` in
// ValueStorage.swift; an error in `failure`) and readable only after an acquire load of
// the state has seen it published (`publishedTag`). Which reader to use:
//
//   settledResult                 anyone: nil while pending, else a Result
//   publishedResult               code that knows the promise settled (a fire callback)
//   result(published: tag)        code that already loaded the tag (inline observation):
//                                 a Result, without a second load
//   fulfilledValue(as:),          a handler's `invoke`, which knows its parent's type
//   rejection, cancellationReason statically: the one side it needs, without a generic
//                                 enum
//   failureOrCancellation         an outcome known not to be a value (an aggregate's
//                                 failed input, a cancelled promise's reason)
//
// Every reader of a rejection marks it seen (`noteErrorSeen`, Diagnostics.swift): a
// rejected promise freed unmarked is an unhandled rejection. Descriptions read `failure`
// itself, which does not count.

extension AnyPromise {
    /// The error of a rejected or cancelled promise. It has no field of its own: it sits
    /// in the first of the core's payload words, which only a fulfilled promise's value
    /// uses (a word less per promise).
    /// Written by the claim winner of a failed outcome, before it publishes (a claim
    /// turned from fulfilled into cancelled writes it before any value is stored); read
    /// only by code that knows the outcome failed, after an acquire load has seen it;
    /// destroyed by the deinit (`destroyFailure`). An all-zero word reads as nil.
    @usableFromInline
    final var failure: (any Error)? {
        @inlinable get { failureSlot.pointee }
        @inlinable set { failureSlot.pointee = newValue }
    }

    @inlinable
    final var failureSlot: UnsafeMutablePointer<(any Error)?> {
        (UnsafeMutableRawPointer(corePointer) + MemoryLayout<pc_promise>.offset(of: \pc_promise.payload)!)
            .assumingMemoryBound(to: (any Error)?.self)
    }

    /// Releases the error of a promise whose claim is a failed outcome (deinit only; the
    /// payload of any other promise is its value's, or untouched zeros). A rejection that
    /// no observer read is reported first (`PromiseDiagnostics`: one load when no handler
    /// is set, and only for rejected promises).
    @inline(__always)
    final func destroyFailure() {
        let claimed = claimHint
        guard claimed == UInt(PC_REJECTED) || claimed == UInt(PC_CANCELLED) else { return }
        if claimed == UInt(PC_REJECTED) {
            // Retired: its error was reported if unread, and released (`freeFailureEarly`).
            guard treeFlags & TreeFlag.retired == 0 else { return }
            reportIfUnseen()
        }
        failureSlot.deinitialize(count: 1)
    }

    /// Stores a rejection's error: only for the winner of a claim to `PC_REJECTED`, before
    /// it publishes.
    final func storeRejection(_ error: any Error) {
        failure = error
        outcomeFreeableEarly = true
    }

    /// Releases a rejection's error now, for a promise that nobody can read any more
    /// (`retireIfOnlyTheCascadeKeepsIt`), reporting it first if no observer read it,
    /// as its deinit would have (nothing can read it later), and leaving the deinit, which
    /// sees `TreeFlag.retired`, nothing to do.
    ///
    /// Released in place, the slot's bits left as they are, as a value is: not `failure =
    /// nil`, a store that ThreadSanitizer would report against a description that read the
    /// error before the retirement, ordered before it only by the runtime's reference
    /// counts, which it does not see.
    final func freeFailureEarly() {
        reportIfUnseen()
        failureSlot.deinitialize(count: 1)
        outcomeFreeableEarly = false
    }

    /// A rejected promise's death: an unhandled rejection if no observer read its error.
    /// Out of line, so that the deinit of every other promise stays as it was.
    @inline(never)
    private final func reportIfUnseen() {
        if !errorWasSeen, let error = failure {
            PromiseDiagnostics.report(.unhandledRejection(error), for: self)
        }
    }

    /// The error of a promise known to have failed: its rejection, or its cancellation
    /// reason (`CancellationError()` when cancelled without one). Reading a rejection
    /// counts as seeing it (`noteErrorSeen`).
    @inlinable
    final var failureOrCancellation: any Error { seenFailureOrCancellation() }

    /// `failureOrCancellation`, out of line: the failure paths that read it stay one call
    /// in the inlined success paths around them.
    @usableFromInline @inline(never)
    final func seenFailureOrCancellation() -> any Error {
        noteErrorSeenIfRejected()
        return failure ?? CancellationError()
    }

    /// The value of a fulfilled promise of `Value` type `T` (nil if not fulfilled).
    @inlinable
    final func fulfilledValue<T: Sendable>(as type: T.Type) -> T? {
        publishedTag == UInt(PC_FULFILLED) ? unsafeDowncast(self, to: Promise<T>.self).storedValue : nil
    }

    /// The error of a rejected promise (nil if fulfilled or cancelled); reading it counts
    /// as seeing it (`noteErrorSeen`).
    @inlinable
    final var rejection: (any Error)? {
        guard publishedTag == UInt(PC_REJECTED) else { return nil }
        noteErrorSeen()
        return failure
    }

    /// The reason of a cancelled promise (nil otherwise).
    @inlinable
    final var cancellationReason: (any Error)? {
        publishedTag == UInt(PC_CANCELLED) ? failureOrCancellation : nil
    }
}

extension Promise {
    /// The outcome `tag` (read with an acquire load, not PC_PENDING) as a `Result`. A
    /// cancelled promise reads as `.failure(reason)`.
    @inlinable @inline(__always)
    func result(published tag: UInt) -> Result<Value, any Error> {
        tag == UInt(PC_FULFILLED) ? .success(storedValue) : .failure(failureOrCancellation)
    }

    /// The published outcome, for code that knows the promise settled (fire callbacks).
    @inlinable @inline(__always)
    var publishedResult: Result<Value, any Error> { result(published: publishedTag) }

    /// The outcome once published, nil while pending.
    @inlinable
    var settledResult: Result<Value, any Error>? {
        let tag = publishedTag
        return tag == UInt(PC_PENDING) ? nil : result(published: tag)
    }
}
