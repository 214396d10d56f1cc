import CPromiseCore

/// A value too large for the inline payload (more than three words, or over-aligned).
@usableFromInline
final class ValueBox<Value> {
    @usableFromInline let value: Value
    @inlinable init(_ value: Value) { self.value = value }
}

// A fulfilled value lives in the core's three `payload` words when it fits (most values:
// integers, references, strings, arrays, small structs), else in a `ValueBox` whose
// reference the payload holds. Written once by the claim winner before it publishes,
// read only after an acquire has seen PC_FULFILLED, destroyed by `deinit`.
extension Promise {
    @inlinable
    static var storesInline: Bool {
        MemoryLayout<Value>.size <= 3 * MemoryLayout<UInt>.size
            && MemoryLayout<Value>.alignment <= MemoryLayout<UInt>.alignment
    }

    @inlinable
    var payloadAddress: UnsafeMutableRawPointer {
        UnsafeMutableRawPointer(corePointer) + MemoryLayout<pc_promise>.offset(of: \pc_promise.payload)!
    }

    /// Stores the value; only for the claim winner, once, before publishing.
    @inlinable
    func storeValue(_ value: Value) {
        if Self.storesInline {
            payloadAddress.initializeMemory(as: Value.self, repeating: value, count: 1)
            if !_isPOD(Value.self) {
                storedValueNeedsDestroy = true
                outcomeFreeableEarly = true
            }
        } else {
            storedValueNeedsDestroy = true
            outcomeFreeableEarly = true
            payloadAddress.storeBytes(of: Unmanaged.passRetained(ValueBox(value)).toOpaque(),
                                      as: UnsafeMutableRawPointer.self)
        }
    }

    /// The stored value; only once the fulfilled outcome was seen with an acquire load.
    @inlinable
    var storedValue: Value {
        if Self.storesInline {
            return payloadAddress.assumingMemoryBound(to: Value.self).pointee
        }
        return Unmanaged<ValueBox<Value>>
            .fromOpaque(payloadAddress.load(as: UnsafeRawPointer.self)).takeUnretainedValue().value
    }

    /// Destroys the stored value (deinit only).
    @usableFromInline
    func destroyStoredValue() {
        // A trivial value needs nothing (and the deinit runs unspecialised, where even the
        // layout queries go through the value witness table).
        guard storedValueNeedsDestroy else { return }
        if Self.storesInline {
            payloadAddress.assumingMemoryBound(to: Value.self).deinitialize(count: 1)
        } else {
            Unmanaged<ValueBox<Value>>.fromOpaque(payloadAddress.load(as: UnsafeRawPointer.self)).release()
        }
    }
}
