// The server binary itself, run as a process: a SIGTERM that reaches it once it is
// listening must stop it as main.swift says (close, stop in order, print the counts,
// exit 0), however soon after it started listening the signal comes.
import Foundation
import NIOCore
import NIOPosix
import XCTest

final class AdversarialServerTests: XCTestCase {
    /// The server is listening (a client can connect) but its main thread is held in the
    /// write of its "listening" line: its stdout is a pipe this test filled beforehand, as
    /// a slow reader of its log would. A SIGTERM sent now must stop it gracefully once the
    /// line gets through; the handlers were installed only after that line (and the port
    /// file), so the default action killed it instead.
    func testASigtermOnceListeningStopsTheServerGracefully() throws {
        let binary = try serverBinary()
        let port = try freePort()

        let output = Pipe()
        let writeEnd = output.fileHandleForWriting.fileDescriptor
        fillPipe(writeEnd)

        let process = Process()
        process.executableURL = binary
        process.arguments = ["--port", String(port), "--threads", "1"]
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        let exited = DispatchSemaphore(value: 0)
        process.terminationHandler = { _ in exited.signal() }
        try process.run()
        defer { if process.isRunning { kill(process.processIdentifier, SIGKILL) } }

        // Listening: the kernel completes a connect once the socket listens.
        try waitUntilConnectable(port: port)

        kill(process.processIdentifier, SIGTERM)

        // Let the held line (and anything after it) through, and read to the end.
        let text = TextBox()
        let drained = DispatchSemaphore(value: 0)
        let reader = output.fileHandleForReading
        DispatchQueue.global().async {
            text.append(reader.readDataToEndOfFile())
            drained.signal()
        }
        try? output.fileHandleForWriting.close()

        guard exited.wait(timeout: .now() + 15) == .success else {
            return XCTFail("the server did not stop within 15 s of SIGTERM")
        }
        _ = drained.wait(timeout: .now() + 5)
        XCTAssertEqual(process.terminationReason, .exit,
                       "killed by signal \(process.terminationStatus) instead of stopping")
        XCTAssertEqual(process.terminationStatus, 0)
        let printed = String(text.string.drop(while: { $0 == "." }))  // past the filler
        XCTAssertTrue(printed.contains("server: stopped; answered 0 requests"), printed)
    }

    // MARK: Helpers

    /// The `server` executable built beside this test bundle.
    private func serverBinary() throws -> URL {
        let candidates = [
            URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent(),
            Bundle(for: Self.self).bundleURL.deletingLastPathComponent(),
            Bundle(for: Self.self).bundleURL,
        ].map { $0.appendingPathComponent("server") }
        guard let found = candidates.first(where: { FileManager.default.isExecutableFile(atPath: $0.path) }) else {
            throw SetupFailure("no server executable beside the tests: \(candidates.map(\.path))")
        }
        return found
    }

    /// A port nothing listens on now (the system's choice for port 0, then let go).
    private func freePort() throws -> Int {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        defer { try? group.syncShutdownGracefully() }
        let channel = try ServerBootstrap(group: group).bind(host: "127.0.0.1", port: 0).wait()
        let port = try XCTUnwrap(channel.localAddress?.port)
        try channel.close().wait()
        return port
    }

    /// Writes to the pipe until it is full, so that the next write to it blocks.
    private func fillPipe(_ fd: Int32) {
        let flags = fcntl(fd, F_GETFL)
        _ = fcntl(fd, F_SETFL, flags | O_NONBLOCK)
        let chunk = [UInt8](repeating: UInt8(ascii: "."), count: 4096)
        while chunk.withUnsafeBytes({ write(fd, $0.baseAddress, $0.count) }) > 0 {}
        // Back to blocking: the flag belongs to the open file, which the server shares.
        _ = fcntl(fd, F_SETFL, flags)
    }

    private func waitUntilConnectable(port: Int) throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        defer { try? group.syncShutdownGracefully() }
        let deadline = Date().addingTimeInterval(10)
        while true {
            if let channel = try? ClientBootstrap(group: group).connect(host: "127.0.0.1", port: port).wait() {
                // A connect from the port itself reaches itself (TCP's self-connect), not
                // the server: that one does not count.
                let connectedToItself = channel.localAddress?.port == port
                try? channel.close().wait()
                if !connectedToItself { return }
            }
            guard Date() < deadline else { throw SetupFailure("the server did not listen within 10 s") }
            usleep(10_000)
        }
    }
}

/// Why the test could not get to its point: a failure, not a skip.
private struct SetupFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// What the reader collected, handed from its thread to the test's.
private final class TextBox: @unchecked Sendable {
    private let lock = NSLock()
    private var data = Data()
    func append(_ more: Data) { lock.lock(); data.append(more); lock.unlock() }
    var string: String { lock.lock(); defer { lock.unlock() }; return String(decoding: data, as: UTF8.self) }
}
