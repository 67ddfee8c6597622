//! A YAML syntax error as an editor counts it: the line and column of the
//! offending character, and the parser's message without its own location
//! or snippet (the caller names the file).
//!
//! The parser reports a tab where it stopped reading the scalar before it
//! (`name: x` on line 4, the tab opening line 5): the position given here is
//! the tab's own.

use serde_saphyr::MessageFormatter;

/// Where and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct YamlError {
    /// 1-based, in the text that was parsed; `None` when the parser gave none.
    pub line: Option<u64>,
    pub column: Option<u64>,
    /// One line, no location.
    pub message: String,
}

/// Describe `err`, raised while parsing `text`.
pub fn describe(err: &serde_saphyr::Error, text: &str) -> YamlError {
    let bare = err.without_snippet();
    let message = serde_saphyr::UserMessageFormatter.format_message(bare);
    let mut message = message
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_string();
    let mut position = err
        .location()
        .filter(|l| l.line() > 0)
        .map(|l| (l.line(), l.column()));
    if is_about_a_tab(&message)
        && let Some(tab) = position.and_then(|(line, _)| tab_from(text, line))
    {
        position = Some(tab);
        message = "a tab where YAML needs spaces (YAML indents with spaces only)".to_string();
    }
    YamlError {
        line: position.map(|p| p.0),
        column: position.map(|p| p.1),
        message,
    }
}

/// Whether a parser message is about a tab character (`found a tab`,
/// `tabs disallowed ...`).
pub fn is_about_a_tab(message: &str) -> bool {
    message
        .split(|c: char| !c.is_ascii_alphabetic())
        .any(|w| w == "tab" || w == "tabs")
}

/// The first tab on `line` (1-based) or within the next few lines, as
/// line and column (in characters).
fn tab_from(text: &str, line: u64) -> Option<(u64, u64)> {
    const LOOKAHEAD: u64 = 3;
    for (i, l) in text.lines().enumerate() {
        let n = i as u64 + 1;
        if n < line {
            continue;
        }
        if n > line + LOOKAHEAD {
            break;
        }
        if let Some(c) = l.chars().position(|c| c == '\t') {
            return Some((n, c as u64 + 1));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(text: &str) -> YamlError {
        match serde_saphyr::from_str::<serde_json::Value>(text) {
            Ok(v) => panic!("parsed: {v}"),
            Err(e) => describe(&e, text),
        }
    }

    #[test]
    fn a_tab_is_reported_where_it_is() {
        let e = error("apiVersion: v1\nmetadata:\n  name: x\n\tnamespace: y\n");
        assert_eq!((e.line, e.column), (Some(4), Some(1)), "{e:?}");
        assert!(e.message.contains("tab"), "{e:?}");
        let e = error("a: 1\nb:\n\t- x\n");
        assert_eq!((e.line, e.column), (Some(3), Some(1)), "{e:?}");
    }

    #[test]
    fn other_errors_keep_the_parsers_position_and_message() {
        let e = error("a: [1\nb: 2\n");
        assert_eq!(e.line, Some(2), "{e:?}");
        assert!(!e.message.contains("line"), "{e:?}");
        assert!(!e.message.contains('\n'), "{e:?}");
        assert!(!e.message.starts_with("error"), "{e:?}");
    }
}
