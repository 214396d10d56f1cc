import Synchronization

/// The "lock" baseline: the smallest thread-safe promise one would write by hand, an
/// array of callbacks and the value under a `Mutex`. Callbacks run on the settling thread
/// (or inline when registered on a settled promise), like `.immediate`.
///
/// The lock guards plain stored properties rather than wrapping a generic state enum
/// (`Mutex<State<Value>>`): a generic class's deinit runs unspecialised, and destroying a
/// `Mutex<State<Value>>` there looks up its metadata at run time on every promise (about 900
/// instructions, 40% of this baseline's settle-one), which a fair baseline should not pay.
/// (Destroying `Value?` still looks up `Optional<Value>`, about 300 instructions: the cost of
/// the obvious generic code, kept.) The lock provides the exclusivity, so the properties skip
/// the runtime's dynamic exclusivity checks.
public final class LockPromise<Value: Sendable>: @unchecked Sendable {
    private let lock = Mutex<Void>(())
    @exclusivity(unchecked) private var callbacks: [@Sendable (Value) -> Void] = []  // under `lock`
    @exclusivity(unchecked) private var value: Value?                                 // under `lock`

    public init() {}

    /// A promise escapes in real use (it is returned, stored, captured); without this the
    /// optimiser could keep a benchmark's short-lived one on the stack, which no real
    /// program gets.
    @inline(never)
    public static func make() -> LockPromise<Value> {
        LockPromise()
    }

    public func whenComplete(_ callback: @escaping @Sendable (Value) -> Void) {
        let settled: Value? = lock.withLock { _ in
            if let value { return value }
            callbacks.append(callback)
            return nil
        }
        if let settled { callback(settled) }
    }

    public func fulfill(_ value: Value) {
        let callbacks: [@Sendable (Value) -> Void]? = lock.withLock { _ in
            guard self.value == nil else { return nil }
            self.value = value
            defer { self.callbacks = [] }
            return self.callbacks
        }
        for callback in callbacks ?? [] { callback(value) }
    }
}
