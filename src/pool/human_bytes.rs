//! [`HumanBytes`]: a byte count in binary units, for the pool's messages (its errors and
//! its statistics' display).

use std::fmt;

/// A byte count that displays in binary units with two decimals ("1.50 MiB"; `B` below
/// 1 KiB), padded to the formatter's width.
///
/// The unit is chosen with integers (the highest set bit), never with a logarithm: the
/// `bytesize` crate, used here before, picks it with `ln` and `powi`, whose results Miri
/// perturbs on purpose, so that under Miri exactly 1 MiB sometimes read "1024.00 KiB".
#[derive(Clone, Copy, Debug)]
pub(crate) struct HumanBytes(pub(crate) u64);

impl fmt::Display for HumanBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use fmt::Write;
        let bytes = self.0;
        let mut text = StackText::default();
        if bytes < 1024 {
            write!(text, "{bytes} B")?;
        } else {
            // 1024^exponent <= bytes < 1024^(exponent + 1), exponent in 1..=6.
            let exponent = bytes.ilog2() / 10;
            let prefix = char::from(b"KMGTPE"[exponent as usize - 1]);
            // The quotient of two floats is correctly rounded (no perturbation under Miri).
            let value = bytes as f64 / (1u64 << (10 * exponent)) as f64;
            write!(text, "{value:.2} {prefix}iB")?;
        }
        f.pad(text.as_str()?)
    }
}

/// A short text written on the stack, so that formatting a byte count allocates nothing: a
/// pool's messages may be written while it is the global allocator and short of budget.
/// The longest [`HumanBytes`] text is 11 bytes ("1024.00 PiB"); a longer write fails.
#[derive(Default)]
struct StackText {
    bytes: [u8; 16],
    len: usize,
}

impl StackText {
    fn as_str(&self) -> Result<&str, fmt::Error> {
        std::str::from_utf8(&self.bytes[..self.len]).map_err(|_| fmt::Error)
    }
}

impl fmt::Write for StackText {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self
            .len
            .checked_add(s.len())
            .filter(|&end| end <= self.bytes.len())
            .ok_or(fmt::Error)?;
        self.bytes[self.len..end].copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn bytes_display_in_binary_units() {
        assert_eq!(HumanBytes(0).to_string(), "0 B");
        assert_eq!(HumanBytes(1023).to_string(), "1023 B");
        assert_eq!(HumanBytes(1024).to_string(), "1.00 KiB");
        assert_eq!(HumanBytes(3 << 19).to_string(), "1.50 MiB");
        assert_eq!(HumanBytes(1 << 40).to_string(), "1.00 TiB");
        assert_eq!(HumanBytes(u64::MAX).to_string(), "16.00 EiB");
        assert_eq!(HumanBytes((1 << 20) - 1).to_string(), "1024.00 KiB");
        assert_eq!(HumanBytes(1 << 20).to_string(), "1.00 MiB");
        assert_eq!(HumanBytes(600 << 10).to_string(), "600.00 KiB");
        assert_eq!(HumanBytes((1 << 60) - 1).to_string(), "1024.00 PiB");
        assert_eq!(HumanBytes(1 << 60).to_string(), "1.00 EiB");
        assert_eq!(format!("{:>8}", HumanBytes(1024)), "1.00 KiB");
    }
}
