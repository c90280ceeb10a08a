//! Text for a terminal from names nobody vetted: file names, bundle metadata, tensor names and
//! config keys reach the `check` table, `inspect`, `detect` and the error lines as they were
//! written by whoever made the file. A control character there (an ANSI "conceal" sequence, an
//! OSC 52 clipboard write, a carriage return over a `FAIL`) or a bidirectional override
//! (U+202E turning `FAIL` into what reads as something else) would make a terminal show what
//! the file wants. [`Safe`] writes everything the CLI prints with those characters spelled out
//! as `\uXXXX`, which is also the JSON escape, so JSON output stays valid and decodes to the
//! same text.

use std::borrow::Cow;
use std::io::{self, Write};

/// Whether `c` must not reach a terminal raw: C0 and C1 controls but newline and tab, DEL, and
/// the Unicode bidirectional controls and line/paragraph separators.
pub fn is_unsafe(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
        || matches!(c, '\u{2028}' | '\u{2029}')
}

/// `s` with every [`is_unsafe`] character written as `\uXXXX`.
pub fn escape(s: &str) -> Cow<'_, str> {
    spell_out(s, is_unsafe)
}

/// `s` on one line: [`escape`], and newlines and tabs written as `\uXXXX` too (a name in a
/// table cell or after a label, where a newline would start a line of the file's choosing).
pub fn one_line(s: &str) -> Cow<'_, str> {
    spell_out(s, |c| c.is_control() || is_unsafe(c))
}

/// `s` with the characters `bad` names written as `\uXXXX`.
fn spell_out(s: &str, bad: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !s.chars().any(&bad) {
        return s.into();
    }
    s.chars()
        .map(|c| {
            if bad(c) {
                format!("\\u{:04x}", c as u32)
            } else {
                c.to_string()
            }
        })
        .collect::<String>()
        .into()
}

/// A writer that escapes what [`is_unsafe`] names in the UTF-8 text passed through it (bytes
/// that are not UTF-8 are written as `\xNN`). A character split across two writes is held until
/// the rest arrives.
///
/// The first error from the writer underneath is kept ([`Safe::failed`]): the CLI ignores errors
/// line by line and reports a failed output once, at the end, as a write error.
pub struct Safe<'a> {
    inner: &'a mut dyn Write,
    pending: Vec<u8>,
    failed: Option<io::Error>,
}

impl<'a> Safe<'a> {
    pub fn new(inner: &'a mut dyn Write) -> Self {
        Safe {
            inner,
            pending: Vec::new(),
            failed: None,
        }
    }

    /// Flush, then the first error any write or flush met, if one did.
    pub fn failed(&mut self) -> Option<&io::Error> {
        let _ = self.flush();
        self.failed.as_ref()
    }

    fn keep<T>(&mut self, r: io::Result<T>) -> io::Result<T> {
        if let (Err(e), None) = (&r, &self.failed) {
            self.failed = Some(io::Error::new(e.kind(), e.to_string()));
        }
        r
    }
}

impl Write for Safe<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.pending.extend_from_slice(buf);
        let mut text = String::with_capacity(self.pending.len());
        let mut rest = &self.pending[..];
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    text.push_str(&escape(s));
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (ok, tail) = rest.split_at(e.valid_up_to());
                    text.push_str(&escape(std::str::from_utf8(ok).expect("checked valid")));
                    match e.error_len() {
                        // An incomplete character at the end: keep it for the next write.
                        None => {
                            rest = tail;
                            break;
                        }
                        Some(n) => {
                            for b in &tail[..n] {
                                text.push_str(&format!("\\x{b:02x}"));
                            }
                            rest = &tail[n..];
                        }
                    }
                }
            }
        }
        let keep = rest.to_vec();
        let written = self.inner.write_all(text.as_bytes());
        self.keep(written)?;
        self.pending = keep;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let pending = std::mem::take(&mut self.pending);
        let mut escaped = String::new();
        for b in pending {
            escaped.push_str(&format!("\\x{b:02x}"));
        }
        let written = self
            .inner
            .write_all(escaped.as_bytes())
            .and_then(|()| self.inner.flush());
        self.keep(written)
    }
}

impl Drop for Safe<'_> {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn through(parts: &[&[u8]]) -> String {
        let mut out = Vec::new();
        {
            let mut safe = Safe::new(&mut out);
            for p in parts {
                safe.write_all(p).unwrap();
            }
        }
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn controls_and_bidi_are_spelled_out() {
        let s = "ok\x1b[8mFAIL\u{202e}SSAP\r\u{2066}x\u{7f}é\n\tend";
        let got = through(&[s.as_bytes()]);
        assert_eq!(got, "ok\\u001b[8mFAIL\\u202eSSAP\\u000d\\u2066x\\u007fé\n\tend");
        assert!(!got.chars().any(is_unsafe));
    }

    #[test]
    fn split_characters_and_bad_bytes() {
        let bytes = "a\u{202e}b".as_bytes();
        // U+202E is 3 bytes: split it over three writes.
        let got = through(&[&bytes[..2], &bytes[2..3], &bytes[3..]]);
        assert_eq!(got, "a\\u202eb");
        assert_eq!(through(&[b"x\xff\xfey"]), "x\\xff\\xfey");
        assert_eq!(through(&[b"x\xe2\x80"]), "x\\xe2\\x80");
    }

    #[test]
    fn json_stays_json() {
        let doc = serde_json::json!({ "file": "a\u{202e}b\u{1b}" });
        let text = through(&[serde_json::to_string(&doc).unwrap().as_bytes()]);
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back, doc);
    }
}
