// libFuzzer target for the opening handshake: HTTPRequestParser fed in chunks chosen by the input's own
// bytes, then validateUpgrade, permessage-deflate negotiation and, when deflate is agreed, the bytes after
// the head inflated as a compressed message. The response parser and the client checks get the same bytes.
// Build: swiftc -sanitize=fuzzer,address -parse-as-library -O Sources/WSProtocol/*.swift Fuzz/HandshakeFuzz.swift \
//        -I Sources/CZlib -I Sources/COpenSSL -lz -lcrypto

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let input = UnsafeRawBufferPointer(start: data, count: size)
    guard size > 0 else { return 0 }
    // Small limits for every other input so the limit paths are reached too.
    let limits = input[0] & 1 == 0 ? HTTPParserLimits() : HTTPParserLimits(maxLineLength: 64, maxHeaderCount: 4, maxHeadSize: 256)
    fuzzRequest(input, limits: limits)
    fuzzResponse(input, limits: limits)
    return 0
}

/// Chunk length at `offset`, taken from the input itself (compare uWebSockets' `makeChunked`): 1...128 bytes.
@inline(__always) func chunkLength(_ input: UnsafeRawBufferPointer, at offset: Int) -> Int {
    1 + (Int(input[offset]) &* 31 &+ offset) % 128
}

func fuzzRequest(_ input: UnsafeRawBufferPointer, limits: HTTPParserLimits) {
    var parser = HTTPRequestParser(limits: limits)
    var offset = 0
    while offset < input.count {
        let end = min(input.count, offset + chunkLength(input, at: offset))
        let chunk = UnsafeRawBufferPointer(rebasing: input[offset..<end])
        let result: HTTPParseResult<HTTPRequestHead>
        do {
            result = try parser.parse(chunk)
        } catch {
            precondition((400...599).contains(error.status), "unexpected status \(error.status)")
            precondition(!error.response().isEmpty)
            return
        }
        switch result {
        case .needMoreData:
            offset = end
        case .complete(let head, let consumed):
            precondition(consumed >= 1 && consumed <= chunk.count, "consumed \(consumed) of \(chunk.count)")
            precondition(offset + consumed <= input.count)
            precondition(head.path.utf8.count <= head.target.utf8.count)
            precondition(head.headers.count <= limits.maxHeaderCount)
            _ = head.queryValue("token")
            let rest = UnsafeRawBufferPointer(rebasing: input[(offset + consumed)...])
            upgrade(head, rest: rest)
            return
        }
    }
}

func upgrade(_ head: HTTPRequestHead, rest: UnsafeRawBufferPointer) {
    let request: UpgradeRequest
    do {
        request = try WebSocketHandshake.validateUpgrade(head)
    } catch {
        precondition([400, 405, 426, 505].contains(error.status), "unexpected status \(error.status)")
        _ = error.response()
        return
    }
    precondition(Base64.decode(request.key)?.count == 16)
    let proto = WebSocketHandshake.selectSubprotocol(offered: request.subprotocols, supported: ["json", "msgpack"])
    for configuration in [PerMessageDeflateConfiguration(),
                          PerMessageDeflateConfiguration(serverNoContextTakeover: true, clientNoContextTakeover: true,
                                                         serverMaxWindowBits: 8, clientMaxWindowBits: 9)] {
        let negotiated = PerMessageDeflate.negotiate(offers: request.extensions, configuration: configuration)
        let response = WebSocketHandshake.response101(key: request.keyBytes, subprotocol: proto, extensions: negotiated?.responseHeaderValue)
        // The client must accept what the server said.
        var responseParser = HTTPResponseParser()
        guard case .complete(let responseHead, let consumed)? = try? responseParser.parse(response), consumed == response.count else {
            preconditionFailure("own 101 response does not parse")
        }
        guard let negotiated else { continue }
        let p = negotiated.parameters
        precondition((8...15).contains(p.serverMaxWindowBits) && (8...15).contains(p.clientMaxWindowBits))
        precondition(p.serverMaxWindowBits <= configuration.serverMaxWindowBits)
        if let answer = try? ExtensionOffer.parse([negotiated.responseHeaderValue]) {
            precondition(answer.count == 1)
        } else {
            preconditionFailure("own answer does not parse")
        }
        _ = responseHead
        // Whatever followed the head, as a compressed message: must never crash or exceed the limit.
        let inflater = PerMessageInflater(parameters: p, role: .server)
        var output: [UInt8] = []
        do {
            try inflater.decompressMessage(rest, into: &output, limit: 1 << 16)
        } catch {
            precondition(output.count <= (1 << 16) + 1)
        }
        let deflater = PerMessageDeflater(parameters: p, role: .server, configuration: configuration)
        let compressed = deflater.compressMessage(rest)
        let back = try? PerMessageInflater(parameters: p, role: .client).decompressMessage(compressed, limit: rest.count)
        precondition(back.map { $0.elementsEqual(rest) } ?? false, "deflate round trip failed")
    }
}

func fuzzResponse(_ input: UnsafeRawBufferPointer, limits: HTTPParserLimits) {
    var parser = HTTPResponseParser(limits: limits)
    var offset = 0
    while offset < input.count {
        let end = min(input.count, offset + chunkLength(input, at: offset))
        let chunk = UnsafeRawBufferPointer(rebasing: input[offset..<end])
        guard let result = try? parser.parse(chunk) else { return }
        switch result {
        case .needMoreData:
            offset = end
        case .complete(let head, let consumed):
            precondition(consumed >= 1 && consumed <= chunk.count)
            precondition((100...999).contains(head.status))
            _ = try? ClientHandshake.verify(head, key: "dGhlIHNhbXBsZSBub25jZQ==", offeredSubprotocols: ["json"],
                                            deflate: PerMessageDeflateConfiguration(serverMaxWindowBits: 12))
            return
        }
    }
}
