import CPromiseCore
import CSwiftRuntime
import Dispatch

// Every call into the Swift runtime below the language, and every assumption about the
// runtime's object layout, is in this file; so are the calls into Dispatch below its
// Swift overlay (`DispatchBridge`). Nothing else in the module calls `swift_*` or
// `dispatch_*`, or computes an object's header size. Each entry says why it is needed
// and what would replace it if the runtime changed.
//
// Orderings: the runtime's `swift_tryRetain`, `swift_unownedRetain` and
// `swift_unownedRelease` are relaxed atomics (`RefCount.h`), and `swift_retain` too; only
// `swift_release` orders (release, and acquire on the path that deallocates). The library
// relies on none of them to order other memory: what a link's reader needs is published
// by the C core's words, and `isOnlyReference` loads the count word with acquire itself.

/// The Swift runtime's reference counts, used directly where the language has no
/// spelling for what the library needs.
@usableFromInline
enum SwiftRuntime {
    /// A strong reference to `object` unless it has begun dying (its strong count reached
    /// zero), in one CAS on the count word. Why: a link that must not keep its target
    /// alive (a child's link up, a registry's link down) still needs a safe way to reach
    /// it. `weak` does that too, but gives every target a side table and sends all later
    /// retains and releases of it through the runtime's slow path. Valid only while the
    /// object's memory is held (`unownedRetain`). If the entry point went away: Swift
    /// `weak` references, at that cost.
    @inline(__always)
    static func tryRetain(_ object: UnsafeMutableRawPointer) -> UnsafeMutableRawPointer? {
        swift_tryRetain(object)
    }

    /// Holds `object`'s memory, not the object: its deinit still runs when its strong
    /// count reaches zero, and its bare memory stays until the last `unownedRelease`.
    /// What `unowned(safe)` references do, without a stored property per link. If the
    /// entry point went away: an `unowned` stored property in a box per link.
    /// The common case is one CAS inline (`pc_rc_unowned_retain_fast`), once the count
    /// word's layout checked out (`RefCountWord.layoutAsExpected`); the runtime's entry
    /// point otherwise. (A hold per child on its parent: about 40 instructions a step of a
    /// chain fewer than the runtime's call.)
    @inline(__always)
    static func unownedRetain(_ object: UnsafeMutableRawPointer) {
        if countWordHasExpectedLayout && pc_rc_unowned_retain_fast(object) { return }
        _ = swift_unownedRetain(object)
    }

    /// Drops a hold taken with `unownedRetain`; the last one frees a dead object's memory
    /// (always through the runtime: `pc_rc_unowned_release_fast` declines it).
    @inline(__always)
    static func unownedRelease(_ object: UnsafeMutableRawPointer) {
        if countWordHasExpectedLayout && pc_rc_unowned_release_fast(object) { return }
        swift_unownedRelease(object)
    }

    /// `RefCountWord.layoutAsExpected`, read from a plain C word after the first check
    /// (`pc_runtime_layout`): one load where the lazy global's accessor calls swift_once.
    @inline(__always)
    static var countWordHasExpectedLayout: Bool {
        let layout = pc_runtime_layout(UInt(PC_RUNTIME_COUNT_WORD))
        if layout == UInt(PC_RUNTIME_LAYOUT_EXPECTED) { return true }
        if layout == UInt(PC_RUNTIME_LAYOUT_OTHER) { return false }
        return recordCountWordLayout()
    }

    @inline(never)
    private static func recordCountWordLayout() -> Bool {
        let expected = RefCountWord.layoutAsExpected
        pc_runtime_layout_set(UInt(PC_RUNTIME_COUNT_WORD), UInt(expected ? PC_RUNTIME_LAYOUT_EXPECTED : PC_RUNTIME_LAYOUT_OTHER))
        return expected
    }

    /// `byteCount` bytes aligned to a word, from malloc, as the runtime allocates objects.
    /// Why: `UnsafeMutableRawPointer.allocate` always takes the aligned allocation path
    /// (posix_memalign, about 45 instructions more), which a `CompletionNode`, made per
    /// observer, should not pay. If the entry point went away: that `allocate`.
    @inlinable @inline(__always)
    static func allocate(byteCount: Int) -> UnsafeMutableRawPointer {
        swift_slowAlloc(byteCount, MemoryLayout<UInt>.alignment - 1)
    }

    /// Frees what `allocate(byteCount:)` returned.
    @inline(__always)
    static func deallocate(_ pointer: UnsafeMutableRawPointer, byteCount: Int) {
        swift_slowDealloc(pointer, byteCount, MemoryLayout<UInt>.alignment - 1)
    }

    /// Whether `object`'s strong count is one: `isKnownUniquelyReferenced` without a
    /// strong variable (which would cost a retain and a release per promise of a dying
    /// chain). If the entry point went away: `isKnownUniquelyReferenced` on a local copy.
    @inline(__always)
    static func isUniquelyReferenced(_ object: UnsafeMutableRawPointer) -> Bool {
        swift_isUniquelyReferenced_nonNull_native(object)
    }

    /// Whether the `strongReferences` strong references the caller knows of (its own
    /// among them) are the only way to `object`, apart from `memoryHolds` holds of its
    /// memory that the caller knows of (`unownedRetain`), in one snapshot of its
    /// reference counts: no other strong reference, no other unowned one, and no side
    /// table, so no `weak` reference, now or before. A user's `weak` or
    /// `unowned` variable can make a strong reference at any time without going through
    /// the library, and turn it back, so the counts must be read at one instant: read one
    /// after the other, a weak reference turned strong between the two reads, and the
    /// weak one dropped, would be seen by neither. Used to free a value early
    /// (`retireIfOnlyTheCascadeKeepsIt`).
    ///
    /// Why the word itself: the runtime has no call that reads the counts together. Its
    /// layout on 64-bit targets (`RefCount.h`, `RefCountBitOffsets<8>`, stable since Swift
    /// 5): bit 0 pure-Swift deallocation, bits 1-31 the unowned count (one for all strong
    /// references, plus one per unowned one), bit 32 deiniting, bits 33-62 the strong
    /// count less one, bit 63 "slow": a side table (made for the first weak reference,
    /// and kept) or an immortal object; the first call checks the layout on an object of
    /// its own (`RefCountWord.layoutAsExpected`). On other targets, or if the layout
    /// changed: false (values are then freed when the cascade ends, as before).
    static func isOnlyReference(to object: UnsafeMutableRawPointer, strongReferences: Int,
                                besidesMemoryHolds memoryHolds: Int) -> Bool {
        #if _pointerBitWidth(_64)
        guard RefCountWord.layoutAsExpected else { return false }
        // Acquire: a reference made from a strong one that was then dropped (a release
        // decrement) is seen with that drop.
        let word = UInt64(loadWordAcquiring((object + RefCountWord.offset).assumingMemoryBound(to: UInt.self)))
        return word & RefCountWord.slowOrDeiniting == 0
            && (word >> RefCountWord.strongExtraShift) & RefCountWord.strongExtraMask == UInt64(strongReferences - 1)
            && (word >> RefCountWord.unownedShift) & RefCountWord.unownedMask == UInt64(1 + memoryHolds)
        #else
        return false
        #endif
    }
}

/// Where the C state sits inside objects: the first stored property follows the Swift
/// runtime's object header (metadata pointer + reference counts, two words on every
/// platform Swift supports), as `_getUnsafePointerToStoredProperties` computes it. The
/// fire callbacks need the reverse (from a node's address back to its object), which the
/// standard library does not offer; debug builds check the assumption against its answer
/// (`checkHeaderSize`).
@usableFromInline
enum CoreLayout {
    @inlinable
    static var headerSize: Int { 2 * MemoryLayout<UnsafeRawPointer>.size }

    /// The object whose first stored property is `node` (an `ObserverBox`, a
    /// `RareState`), not retained.
    @inlinable
    static func owner<Object: AnyObject>(ofFirstField node: UnsafeMutablePointer<pc_node>, as type: Object.Type) -> Unmanaged<Object> {
        Unmanaged.fromOpaque(UnsafeRawPointer(node) - headerSize)
    }

    /// Debug builds: `headerSize` is where the standard library puts `object`'s first
    /// stored property. Called once per process, by the first promise made.
    static func checkHeaderSize(of object: AnyObject) {
        let start = UnsafeRawPointer(Unmanaged.passUnretained(object).toOpaque())
        let stored = UnsafeRawPointer(_getUnsafePointerToStoredProperties(object))
        assert(stored - start == headerSize,
               "the Swift object header is \(stored - start) bytes, not the \(headerSize) CoreLayout assumes")
    }

    /// Runs `checkHeaderSize` once, in debug builds only.
    static let headerChecked: Bool = {
        checkHeaderSize(of: ObserverBoxLayoutProbe())
        return true
    }()
}

/// An object to measure the header on (any Swift class has the same header).
private final class ObserverBoxLayoutProbe {
    var field = 0
}

/// The 64-bit layout of a native Swift object's inline reference count word (the second
/// word of its header), for `SwiftRuntime.isOnlyReference`.
enum RefCountWord {
    static let offset = MemoryLayout<UnsafeRawPointer>.size
    static let unownedShift: UInt64 = 1
    static let unownedMask: UInt64 = (1 << 31) - 1
    static let strongExtraShift: UInt64 = 33
    static let strongExtraMask: UInt64 = (1 << 30) - 1
    /// The "slow" bit (side table, or immortal) and the deiniting bit.
    static let slowOrDeiniting: UInt64 = (1 << 63) | (1 << 32)

    /// Whether the layout is where this file says, on an object given one extra strong
    /// and one unowned reference, then a weak one (debug builds assert it). Found once.
    static let layoutAsExpected: Bool = {
        let probe = ObserverBoxLayoutProbe()
        let object = Unmanaged.passUnretained(probe).toOpaque()
        func word() -> UInt64 { UInt64(loadWordAcquiring((object + offset).assumingMemoryBound(to: UInt.self))) }
        let extra = Unmanaged.passRetained(probe)
        // The runtime's own entry points: `SwiftRuntime`'s ask this very check first.
        _ = swift_unownedRetain(object)
        let counted = word()
        swift_unownedRelease(object)
        extra.release()
        weak var weakProbe = probe
        let withWeak = word()
        weakProbe = nil
        let expected = counted & slowOrDeiniting == 0 && (counted >> strongExtraShift) & strongExtraMask == 1
            && (counted >> unownedShift) & unownedMask == 2 && withWeak & (1 << 63) != 0
        assert(expected, "the Swift runtime's reference count word changed its layout "
               + "(0x\(String(counted, radix: 16)), 0x\(String(withWeak, radix: 16)))")
        return expected && weakProbe == nil
    }()
}

/// Dispatch below its Swift overlay: the function variants of `async`
/// (`dispatch_async_f`), which send a C function and one pointer where the overlay's
/// `async` sends a block, a malloc and a free per call (`Block_copy`), and a retain and a
/// release of what the closure captures. Used for the work a promise sends most: a
/// child's handler, or a `whenComplete` box, to a `DispatchQueue`, `.concurrent(queue)`
/// or `.default`. If the overlay's layout changed (checked once): the overlay's `async`,
/// as for every other context. (The entry points are bound by symbol when linking.)
enum DispatchBridge {
    /// What runs on the queue: a C function of the one pointer sent with it.
    typealias Work = @convention(c) (UnsafeMutableRawPointer?) -> Void

    /// The Dispatch queue that `queue` wraps, or nil where this file does not know where
    /// it is (the caller then uses the overlay's `async`). On Linux the overlay's
    /// `DispatchQueue` is a Swift object whose only stored property, `__wrapped`, is that
    /// queue; the first call checks it (`queueLayoutAsExpected`).
    @inline(__always)
    static func dispatchQueue(of queue: DispatchQueue) -> UnsafeMutableRawPointer? {
        #if os(Linux)
        let layout = pc_runtime_layout(UInt(PC_RUNTIME_DISPATCH_QUEUE))
        if layout == UInt(PC_RUNTIME_LAYOUT_EXPECTED) || (layout == UInt(PC_RUNTIME_LAYOUT_UNKNOWN) && recordQueueLayout()) {
            return (Unmanaged.passUnretained(queue).toOpaque() + CoreLayout.headerSize).load(as: UnsafeMutableRawPointer.self)
        }
        #endif
        return nil
    }

    /// Runs `work(context)` on `queue` (from `dispatchQueue(of:)`), as a barrier or not,
    /// as the overlay's `async(flags:execute:)` would run a block.
    @inline(__always)
    static func async(on queue: UnsafeMutableRawPointer, barrier: Bool, _ context: UnsafeMutableRawPointer,
                      _ work: Work) {
        #if os(Linux)
        if barrier {
            pc_dispatch_barrier_async_f(queue, context, work)
        } else {
            pc_dispatch_async_f(queue, context, work)
        }
        #else
        preconditionFailure("dispatchQueue(of:) returns nil on this platform")
        #endif
    }

    /// Runs `work(object)` on the library's default queue (`.default`), `object` retained
    /// for `work`; false, with nothing sent, where the queue cannot be reached this way.
    @inline(__always)
    static func sendToDefaultQueue(retaining object: AnyObject, _ work: Work) -> Bool {
        guard let queue = dispatchQueue(of: DefaultExecutionContext.queue) else { return false }
        async(on: queue, barrier: false, Unmanaged.passRetained(object).toOpaque(), work)
        return true
    }

    #if os(Linux)
    @inline(never)
    private static func recordQueueLayout() -> Bool {
        let expected = queueLayoutAsExpected
        pc_runtime_layout_set(UInt(PC_RUNTIME_DISPATCH_QUEUE),
                              UInt(expected ? PC_RUNTIME_LAYOUT_EXPECTED : PC_RUNTIME_LAYOUT_OTHER))
        return expected
    }

    /// Whether a queue of its own has one stored property, `__wrapped`, the first after
    /// the object header, and no other in its class or above: reflection names the
    /// property and gives its value, which must be the word there. Found once.
    static let queueLayoutAsExpected: Bool = {
        let probe = DispatchQueue(label: "Promise.layout-probe")
        let mirror = Mirror(reflecting: probe)
        guard mirror.children.count == 1, let only = mirror.children.first, only.label == "__wrapped",
              let wrapped = only.value as? OpaquePointer,
              mirror.superclassMirror.map({ $0.children.isEmpty && $0.superclassMirror == nil }) ?? true
        else { return false }
        let stored = (Unmanaged.passUnretained(probe).toOpaque() + CoreLayout.headerSize).load(as: UnsafeRawPointer.self)
        return UnsafeRawPointer(wrapped) == stored
    }()
    #endif
}
