import CPromiseCore

// What `print(promise)` and the debugger show. Nothing here is on a hot path, and nothing
// is stored for it: each call reads the state word with one acquire load, then the
// outcome (immutable once published) and the parent link.

extension AnyPromise: CustomStringConvertible, CustomDebugStringConvertible {
    /// The type, the state and, once settled, the value or the error.
    ///
    /// ```swift
    /// print(Promise<Int>())                        // Promise<Int>(pending)
    /// print(Promise(value: 42))                    // Promise<Int>(fulfilled: 42)
    /// print(Promise<Int>(error: PromiseError.timedOut))
    /// // Promise<Int>(rejected: the promise timed out before it was settled)
    /// ```
    ///
    /// The value is shown as `debugPrint` shows it (a string in quotes), an error as
    /// `print` shows it (the sentence of a `PromiseError`). A cancelled promise shows its
    /// reason. The text is a snapshot: another thread may settle the promise right after.
    public final var description: String {
        "\(typeName)(\(outcomeDescription))"
    }

    /// `description`, plus the promise's address, where it was made (debug builds of the
    /// library record it: see `PromiseDiagnostics`), whether observers are still waiting
    /// for it, and its parent: what to look at when a promise seems stuck.
    ///
    /// ```swift
    /// let root = Promise<Int>()
    /// let child = root.then { $0 + 1 }
    /// debugPrint(child)
    /// // Promise<Int>(pending) at 0x00005605c3f4a2d0, no observers waiting,
    /// //   parent Promise<Int>(pending) at 0x00005605c3f4a1e0
    /// ```
    ///
    /// The parent reads `parent released` once it is gone (a settled promise does not
    /// keep its parent: see `parent`) and `root` for a promise without one. It says
    /// whether observers are waiting (not those that gave up, nor what waits only for a
    /// cancel: `onCancel` handlers, the error side of a child already settled), not how
    /// many: it looks at them while it holds the list for a moment, as a prune does, and
    /// stops at the first that waits.
    public final var debugDescription: String {
        let waiting = anyObserverWaits ? "observers waiting" : "no observers waiting"
        let up: String
        if parentAddress == nil {
            up = "root"
        } else if let parent = parentIfReachable {
            up = "parent \(parent.description) at \(parent.addressDescription)"
        } else {
            up = "parent released"
        }
        let made = creationSiteIfRecorded.map { ", made at \($0)" } ?? ""
        return "\(description) at \(addressDescription)\(made), \(waiting), \(up)"
    }

    /// Whether an observer still waits for this promise: not those that gave up (a
    /// timed-out `wait`, the slot of a combinator that settled without it, a child
    /// cancelled or settled otherwise) nor what waits only for a cancel (see
    /// `nodeWaitsForAnOutcome`). The nodes are looked at while a prune that keeps them all
    /// holds the stack; if another prune holds it, or the promise settles meanwhile, the
    /// stack's emptiness answers.
    private var anyObserverWaits: Bool {
        guard hasWaitingObservers else { return false }
        var look = ObserverLook(promise: Unmanaged.passUnretained(self))
        var kept = 0
        let looked = withUnsafeMutablePointer(to: &look) { pointer in
            pc_prune(corePointer, observerLookWaits, releaseNothing, UnsafeMutableRawPointer(pointer), &kept)
        }
        return looked ? look.found : hasWaitingObservers
    }

    private var outcomeDescription: String {
        switch publishedTag {
        case UInt(PC_FULFILLED): return "fulfilled: \(describeFulfilledValue())"
        // `failure` itself: printing a promise does not count as seeing its error.
        case UInt(PC_REJECTED): return "rejected: \(failure ?? CancellationError())"
        case UInt(PC_CANCELLED): return "cancelled: \(failure ?? CancellationError())"
        default: return "pending"
        }
    }

    private var addressDescription: String {
        let address = UInt(bitPattern: ObjectIdentifier(self))
        let hex = String(address, radix: 16)
        return "0x" + String(repeating: "0", count: max(0, 2 * MemoryLayout<UInt>.size - hex.count)) + hex
    }
}

/// What `anyObserverWaits` shows each node to, through `pc_prune`'s context.
private struct ObserverLook {
    let promise: Unmanaged<AnyPromise>
    var found = false
}

/// `pc_prune`'s test for `anyObserverWaits`: notes a node that waits, takes none off.
private func observerLookWaits(_ node: UnsafeMutablePointer<pc_node>, _ context: UnsafeMutableRawPointer?) -> Bool {
    let look = context.unsafelyUnwrapped.assumingMemoryBound(to: ObserverLook.self)
    if !look.pointee.found {
        look.pointee.found = look.pointee.promise._withUnsafeGuaranteedRef { $0.nodeWaitsForAnOutcome(node) }
    }
    return false
}

/// `pc_prune`'s release for `anyObserverWaits`, which takes nothing off.
private func releaseNothing(_ node: UnsafeMutablePointer<pc_node>, _ context: UnsafeMutableRawPointer?) {}
