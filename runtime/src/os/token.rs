//! [`Token`]: the per-run secret a guest presents with every frame.

use std::fmt;

/// How many random bytes a token holds (rendered as twice as many hex digits).
const TOKEN_BYTES: usize = 32;

/// A per-run secret: 32 bytes from the operating system's CSPRNG, as lowercase hex.
///
/// The socket server checks it before it looks at anything else in a frame. Its `Debug`
/// output is redacted so it never lands in logs.
///
/// It has no `PartialEq`: the only comparison is [`Token::matches`], in constant time.
#[derive(Clone)]
pub struct Token(String);

impl Token {
    /// A fresh random token.
    ///
    /// # Errors
    ///
    /// When the operating system's random source fails.
    pub fn generate() -> std::io::Result<Token> {
        let mut bytes = [0u8; TOKEN_BYTES];
        getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(Token(hex(&bytes)))
    }

    /// A token with known text, for the fuzz targets (`crate::fuzzing`): never for a run.
    pub(crate) fn known(text: &str) -> Token {
        Token(text.to_owned())
    }

    /// The token's text, as the guest must present it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// True when `presented` is this token. The comparison takes the same time wherever the
    /// first difference is.
    /// (A token's length is public: 64 hex digits.)
    pub fn matches(&self, presented: &str) -> bool {
        use subtle::ConstantTimeEq;
        self.0.as_bytes().ct_eq(presented.as_bytes()).into()
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// Random bytes as lowercase hex, for tokens and private names.
pub(crate) fn random_hex(n: usize) -> std::io::Result<String> {
    let mut bytes = vec![0u8; n];
    getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(hex(&bytes))
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_64_hex_digits_and_differ() {
        let a = Token::generate().unwrap();
        let b = Token::generate().unwrap();
        assert_eq!(a.as_str().len(), 64);
        assert!(a.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
        assert!(!a.matches(b.as_str()));
    }

    #[test]
    fn matching_is_exact() {
        let t = Token::generate().unwrap();
        assert!(t.matches(t.as_str()));
        assert!(!t.matches(""));
        assert!(!t.matches(&t.as_str()[..63]));
        assert!(!t.matches(&t.as_str().to_uppercase()));
        let mut other = t.as_str().to_owned();
        other.replace_range(63.., if other.ends_with('0') { "1" } else { "0" });
        assert!(!t.matches(&other));
    }

    #[test]
    fn debug_does_not_leak() {
        let t = Token::generate().unwrap();
        assert!(!format!("{t:?}").contains(t.as_str()));
    }
}
