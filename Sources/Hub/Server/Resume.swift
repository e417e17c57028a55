import HubRouting

/// How a `subscribe` turns a channel's two streams (the account's and the channel's broadcasts) into one position
/// for the app, and a resume into one all-or-nothing answer. Pure functions: `ClientConnection.subscribe` does the I/O.
enum Resume {
    /// The two stream epochs a channel epoch (`ClientReplies.ChannelEpoch.text`) stands for, if it is one of this
    /// hub's epochs (another hub epoch, or text that is not an epoch at all, is nil: the numbering the app knew is
    /// gone).
    static func streamEpochs(of epoch: String, hubEpoch: String) -> (account: String, broadcast: String)? {
        let parts = epoch.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, parts[0] == hubEpoch, !parts[1].isEmpty, !parts[2].isEmpty else { return nil }
        return (String(parts[1]), String(parts[2]))
    }

    /// One answer for both streams: replay both or neither. The most fundamental failure wins (a restarted numbering,
    /// then events gone, then too many).
    static func combine(_ account: Result<[RetainedEvent], RecoveryFailure>?, _ broadcast: Result<[RetainedEvent], RecoveryFailure>?)
        -> Result<[RetainedEvent], RecoveryFailure> {
        let failures = [account, broadcast].compactMap { result -> RecoveryFailure? in
            if case .failure(let f) = result { return f }
            return nil
        }
        for failure in [RecoveryFailure.epochChanged, .tooOld, .tooMany] where failures.contains(failure) { return .failure(failure) }
        var a: [RetainedEvent] = []
        var b: [RetainedEvent] = []
        if case .success(let events) = account { a = events }
        if case .success(let events) = broadcast { b = events }
        return .success(merge(a, b))
    }

    /// Both streams' events in the order they were published (each stream stays in seq order).
    static func merge(_ a: [RetainedEvent], _ b: [RetainedEvent]) -> [RetainedEvent] {
        if a.isEmpty { return b }
        if b.isEmpty { return a }
        var merged: [RetainedEvent] = []
        merged.reserveCapacity(a.count + b.count)
        var i = 0, j = 0
        while i < a.count && j < b.count {
            if b[j].acceptedAt < a[i].acceptedAt { merged.append(b[j]); j += 1 } else { merged.append(a[i]); i += 1 }
        }
        merged.append(contentsOf: a[i...])
        merged.append(contentsOf: b[j...])
        return merged
    }
}
