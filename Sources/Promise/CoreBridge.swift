import CPromiseCore

// Every call into the C core, and every retain or release that crosses it, is in this
// file (swift-system's Syscalls.swift is the model). Ownership rule: a node that is
// registered (pc_observe) or deferred (pc_defer) carries one retain of the object that
// embeds it; whoever receives the node back in a fire callback owns that retain.

/// Where the C state sits inside objects: the first stored property follows the Swift
/// runtime's object header (metadata pointer + reference counts, two words on every
/// platform Swift supports), as `_getUnsafePointerToStoredProperties` computes it.
@usableFromInline
enum CoreLayout {
    @inlinable
    static var headerSize: Int { 2 * MemoryLayout<UnsafeRawPointer>.size }

    /// Offset of the promise's own node inside its `pc_promise`.
    @inlinable
    static var nodeOffsetInCore: Int { MemoryLayout<pc_promise>.offset(of: \pc_promise.node)! }
}

extension AnyPromise {
    /// The promise's C state. `core` is the first stored property of the root class, so
    /// its address is the start of the stored properties, and it never moves.
    @inlinable
    final var corePointer: UnsafeMutablePointer<pc_promise> {
        _getUnsafePointerToStoredProperties(self).assumingMemoryBound(to: pc_promise.self)
    }

    @inlinable
    final var nodePointer: UnsafeMutablePointer<pc_node> {
        (UnsafeMutableRawPointer(corePointer) + CoreLayout.nodeOffsetInCore)
            .assumingMemoryBound(to: pc_node.self)
    }

    /// The object whose `core` is at `core` (not retained).
    @inlinable
    static func owner(ofCore core: UnsafeMutablePointer<pc_promise>) -> Unmanaged<AnyPromise> {
        Unmanaged.fromOpaque(UnsafeRawPointer(core) - CoreLayout.headerSize)
    }

    @inlinable
    static func owner(ofNode node: UnsafeMutablePointer<pc_node>) -> Unmanaged<AnyPromise> {
        Unmanaged.fromOpaque(UnsafeRawPointer(node) - CoreLayout.nodeOffsetInCore - CoreLayout.headerSize)
    }

    /// `PC_PENDING` or the published outcome; acquire, so the outcome's slots are readable.
    @inlinable
    final var publishedTag: UInt { UInt(pc_state(corePointer)) }

    /// The claim word, as a hint (confirmed by `claim` before acting on it).
    @inlinable
    final var claimHint: UInt { UInt(pc_claimed(corePointer)) }

    /// Elects this caller as the one allowed to move the claim from `expected` to `desired`.
    @inlinable
    final func claim(from expected: UInt32, to desired: UInt32) -> Bool {
        pc_claim(corePointer, UInt(expected), UInt(desired))
    }

    /// Publishes the outcome this thread claimed (its slot already written) and fires
    /// the observers in registration order.
    @inlinable
    final func publishClaimedOutcome() {
        pc_publish(corePointer)
    }

    /// Registers this promise's own node on `source`, transferring one retain of `self`
    /// to the node (balanced in `promiseNodeFire` or in `releaseDetached`).
    @usableFromInline
    final func observe(_ source: AnyPromise, as role: NodeRole) {
        self.role = role
        nodePointer.pointee.fire = promiseNodeFire
        _ = Unmanaged.passRetained(self)
        pc_observe(source.corePointer, nodePointer)
    }

    /// Runs `promiseNodeFire(node, nil)` after the current firing on this thread; the
    /// retain the node carries goes with it.
    @usableFromInline
    final func deferOnThisThread() {
        pc_defer(nodePointer)
    }
}

/// The fire callback of a promise's own node: `source` is the promise it observed
/// (parent or followee) when that one settled, or nil when the node was deferred.
@usableFromInline
func promiseNodeFire(_ node: UnsafeMutablePointer<pc_node>, _ source: UnsafeMutablePointer<pc_promise>?) {
    let owner = AnyPromise.owner(ofNode: node)
    if let source {
        // The node's retain is handed to `sourceDidSettle`, which keeps or releases it.
        // Both references are borrowed, not retained for the call (a retain and a release
        // each, on the runtime's slow path for promises with a side table): the source is
        // held by whoever publishes or observes it until this returns, and the owner by the
        // node's retain, which `sourceDidSettle` releases only as the last thing it does.
        owner._withUnsafeGuaranteedRef { promise in
            AnyPromise.owner(ofCore: source)._withUnsafeGuaranteedRef { source in
                promise.sourceDidSettle(source, retained: owner)
            }
        }
    } else {
        owner.takeRetainedValue().runDeferred()
    }
}

extension ObserverBox {
    @inlinable
    final var nodePointer: UnsafeMutablePointer<pc_node> {
        _getUnsafePointerToStoredProperties(self).assumingMemoryBound(to: pc_node.self)
    }

    /// Registers the box on `source`, transferring one retain of the box to its node.
    @usableFromInline
    final func register(on source: AnyPromise) {
        nodePointer.pointee.fire = observerBoxFire
        _ = Unmanaged.passRetained(self)
        pc_observe(source.corePointer, nodePointer)
    }
}

/// The fire callback of an `ObserverBox` (whenComplete, onCancel, resolve(with:), wait).
@usableFromInline
func observerBoxFire(_ node: UnsafeMutablePointer<pc_node>, _ source: UnsafeMutablePointer<pc_promise>?) {
    let box = Unmanaged<ObserverBox>.fromOpaque(UnsafeRawPointer(node) - CoreLayout.headerSize)
    if let source {
        let observer = box.takeUnretainedValue()
        observer.source = AnyPromise.owner(ofCore: source).takeUnretainedValue()
        if observer.context.isImmediate {
            pc_defer(node)  // the node's retain goes with it
        } else {
            observer.context.execute { observer.fire() }
            box.release()
        }
    } else {
        box.takeRetainedValue().fire()
    }
}

/// Whether `node` fires through `fire`: tells the kinds of node apart (a promise's own, an
/// `ObserverBox`'s, an aggregator slot's, a waiter's) when a dying promise releases them.
func nodeFires(_ node: UnsafeMutablePointer<pc_node>, through fire: pc_fire_fn) -> Bool {
    unsafeBitCast(node.pointee.fire, to: UnsafeRawPointer?.self) == unsafeBitCast(fire, to: UnsafeRawPointer.self)
}

extension AnyPromise {
    /// Releases what a dying promise owns without recursing: observers of a promise that
    /// never settled, and the settled parent. A promise that only we still hold would
    /// release its own links from inside its deinit, one level deeper each time (a
    /// million-step chain would overflow the stack), so its links are stolen into this
    /// loop first and it dies with nothing left to release.
    final func releaseOwnedLinksIteratively() {
        var work: UnsafeMutablePointer<pc_node>? = nil  // dying promises, linked by their free nodes

        func release(_ owned: Unmanaged<AnyPromise>) {
            var promise = owned.takeRetainedValue()
            if isKnownUniquelyReferenced(&promise) {
                // Its node is in no list (a list would hold a retain): reuse it as our link.
                promise.nodePointer.pointee.next = work
                work = promise.nodePointer
                _ = Unmanaged.passRetained(promise)
            }
        }

        func stealLinks(of promise: AnyPromise) {
            var observer = pc_detach(promise.corePointer)
            while let node = observer {
                observer = node.pointee.next
                if nodeFires(node, through: promiseNodeFire) {
                    release(AnyPromise.owner(ofNode: node))
                } else if nodeFires(node, through: aggregatorSlotFire) {
                    releaseAggregatorSlot(node)
                } else if nodeFires(node, through: waiterFire) {
                    Unmanaged<WaiterBase>.fromOpaque(UnsafeRawPointer(node) - CoreLayout.headerSize).release()
                } else {
                    var box = Unmanaged<ObserverBox>.fromOpaque(UnsafeRawPointer(node) - CoreLayout.headerSize)
                        .takeRetainedValue()
                    if isKnownUniquelyReferenced(&box), let owned = box.detachOwnedPromise() {
                        release(owned)  // the box dies below with nothing left to release
                    }
                }
            }
            if let parent = promise.settledParentRetain {
                promise.settledParentRetain = nil
                release(parent)
            }
        }

        stealLinks(of: self)
        while let node = work {
            work = node.pointee.next
            let promise = AnyPromise.owner(ofNode: node).takeRetainedValue()
            stealLinks(of: promise)
            // `promise` dies here, with nothing left to release.
        }
    }
}
