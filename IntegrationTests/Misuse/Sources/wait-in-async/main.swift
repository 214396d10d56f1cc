// Must not compile: wait() and wait(timeout:) are unavailable from async contexts.
import Promise

func blocksACooperativeThread(_ promise: Promise<Int>) async throws -> Int {
    try promise.wait() + promise.wait(timeout: .seconds(1))
}

print(try await blocksACooperativeThread(Promise(value: 1)))
