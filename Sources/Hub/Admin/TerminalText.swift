/// Text from clients and backends made safe to print on an operator's terminal.
///
/// `X-Platform`, `X-App-Version`, a token's `sub`, an event's type and data are chosen by whoever connects or
/// publishes. Printed raw, an ESC or C1 sequence in them is executed by the terminal: it can clear the screen,
/// rewrite what earlier lines said, set the window title, or (on some terminals) answer back into the shell's input.
/// hubctl's human output passes every such string through `escape`; `--json` output stays byte-exact.
public enum TerminalText {
    /// Replaces each control character with a visible escape: C0 (U+0000-U+001F, tab and newline included: a
    /// cell is one line), DEL (U+007F) and C1 (U+0080-U+009F) become `\xHH`, two lowercase hex digits of the code
    /// point (Python's `repr` style: U+009B, UTF-8 `C2 9B`, shows as `\x9b`). Everything else is kept as is, a
    /// backslash included, so a literal `\x1b` typed by a client reads the same as an escaped ESC: `--json` tells
    /// them apart.
    public static func escape(_ text: String) -> String {
        guard text.unicodeScalars.contains(where: isControl) else { return text }
        var out = String.UnicodeScalarView()
        for scalar in text.unicodeScalars {
            guard isControl(scalar) else {
                out.append(scalar)
                continue
            }
            let value = scalar.value
            out.append("\\")
            out.append("x")
            out.append(hexDigit(value >> 4))
            out.append(hexDigit(value & 0xF))
        }
        return String(out)
    }

    /// C0, DEL or C1.
    public static func isControl(_ scalar: Unicode.Scalar) -> Bool {
        scalar.value < 0x20 || (0x7F...0x9F).contains(scalar.value)
    }

    private static func hexDigit(_ nibble: UInt32) -> Unicode.Scalar {
        Unicode.Scalar(UInt8(nibble < 10 ? 0x30 + nibble : 0x61 + nibble - 10))
    }
}
