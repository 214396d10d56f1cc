import CPromiseCore
import CSwiftRuntime

// Every call into the Swift runtime below the language, and every assumption about the
// runtime's object layout, is in this file. Nothing else in the module calls `swift_*`
// or computes an object's header size. Each entry says why it is needed and what would
// replace it if the runtime changed.

/// The Swift runtime's reference counts, used directly where the language has no
/// spelling for what the library needs.
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
    @inline(__always)
    static func unownedRetain(_ object: UnsafeMutableRawPointer) {
        _ = swift_unownedRetain(object)
    }

    /// Drops a hold taken with `unownedRetain`; the last one frees a dead object's memory.
    @inline(__always)
    static func unownedRelease(_ object: UnsafeMutableRawPointer) {
        swift_unownedRelease(object)
    }

    /// Whether `object`'s strong count is one: `isKnownUniquelyReferenced` without a
    /// strong variable (which would cost a retain and a release per promise of a dying
    /// chain). If the entry point went away: `isKnownUniquelyReferenced` on a local copy.
    @inline(__always)
    static func isUniquelyReferenced(_ object: UnsafeMutableRawPointer) -> Bool {
        swift_isUniquelyReferenced_nonNull_native(object)
    }

    /// Whether the caller's strong reference is the only way to `object`, apart from
    /// `memoryHolds` holds of its memory that the caller knows of (`unownedRetain`): no
    /// other strong reference, no `weak` one and no other unowned one. A user's `weak` or
    /// `unowned` variable can make a strong reference at any time without going through
    /// the library, so the library frees a value early only when there is none
    /// (`freeValueIfOnlyTheCascadeKeepsIt`). The strong count is read first: a reference
    /// made from a strong one that was then dropped is seen with that drop. If the entry
    /// points went away: false (values are then freed when the cascade ends).
    static func isOnlyReference(to object: UnsafeMutableRawPointer, besidesMemoryHolds memoryHolds: Int) -> Bool {
        guard swift_isUniquelyReferenced_nonNull_native(object) else { return false }
        fullFence()  // the counts below are read after the strong count (acquire)
        // The weak count is one more than the weak references while a side table exists
        // (zero or one without); the unowned count, one for the strong references.
        return swift_weakRetainCount(object) <= 1 && swift_unownedRetainCount(object) <= 1 + memoryHolds
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
