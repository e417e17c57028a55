import Glibc

/// Files the hub trusts because of who can write them: its secrets and its saved state.
package enum FileTrust {
    /// Why a secret or state file cannot be trusted, or nil: another user than this process's (or root) owns it, or
    /// group or others may write it. Whoever can write it can mint tokens (a secret) or rewind numbering (a state
    /// file), as ssh refuses a private key that others can change.
    package static func ownershipProblem(_ info: stat) -> String? {
        let owner = info.st_uid
        if owner != geteuid() && owner != 0 {
            return "it is owned by uid \(owner), not by the hub's user (uid \(geteuid())) or root"
        }
        if info.st_mode & (S_IWGRP | S_IWOTH) != 0 {
            return "group or others may write it (mode \(String(info.st_mode & 0o777, radix: 8))); chmod go-w it"
        }
        return nil
    }
}
