//! For people: byte counts in binary units, as the `bytesize` crate writes them, and tables,
//! as `comfy-table` lays them out (in Markdown, so that a run's table pastes into a README
//! as it is).

/// `count` bytes for display: `B` below 1 KiB, else the largest binary unit that keeps the
/// number at least 1; one decimal by default ("52.6 MiB", the tables), two with `{:.2}`
/// ("9.54 MiB", the messages, as the pool's own errors write them).
///
/// ```
/// use train_replay::show::bytes;
/// assert_eq!(bytes(3 << 19).to_string(), "1.5 MiB");
/// assert_eq!(format!("{:.2}", bytes(10_000_000)), "9.54 MiB");
/// assert_eq!(bytes(1000).to_string(), "1000 B");
/// ```
pub fn bytes(count: u64) -> bytesize::Display {
    bytesize::ByteSize(count).display().iec()
}

/// An empty Markdown table with `header`: each column as wide as its widest cell.
///
/// ```
/// let mut table = train_replay::show::table(["", "value"]);
/// table.add_row(["peak RSS", "52.6 MiB"]);
/// assert_eq!(
///     table.to_string(),
///     "|          | value    |\n|----------|----------|\n| peak RSS | 52.6 MiB |"
/// );
/// ```
pub fn table<T: Into<comfy_table::Cell>>(
    header: impl IntoIterator<Item = T>,
) -> comfy_table::Table {
    let mut table = comfy_table::Table::new();
    table
        .load_preset(comfy_table::presets::ASCII_MARKDOWN)
        .set_header(header);
    table
}

/// `text` fit for a terminal: control characters but line breaks and tabs escaped
/// (`\u{0}`, `\u{1b}`), so that a model's early samples (a byte-level one draws any byte) neither
/// move the cursor nor make `grep` call the output binary. (Bytes that were not UTF-8 were
/// decoded as U+FFFD already.)
///
/// ```
/// assert_eq!(
///     train_replay::show::printable("a\0b\x1b[2J\nc\td"),
///     "a\\u{0}b\\u{1b}[2J\nc\td"
/// );
/// ```
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\n' | '\t' => c.to_string(),
            c if c.is_control() => c.escape_unicode().to_string(),
            c => c.to_string(),
        })
        .collect()
}
