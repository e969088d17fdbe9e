//! What the process log may say about text that can hold a credential (SPEC 9.1 r3): a URL is shown as
//! scheme, host, port and path only (no userinfo, no query, no fragment), and error texts, whose
//! libraries often embed the URL they failed on (reqwest's "error sending request for url (…)"), are
//! cleaned the same way before they reach a log line.

use std::borrow::Cow;

/// A URL for the log: `https://user:pw@host:8443/rpc?api_key=…#x` → `https://host:8443/rpc`.
pub fn url(text: &str) -> String {
    scrub(text).into_owned()
}

/// An error and its causes on one line (`outer: cause: root cause`), every URL in it shown as [`url`]
/// shows it. Many errors (reqwest's among them) print only their own level, so the causes are where
/// the operator learns what really failed.
pub fn error(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        // Some errors repeat their cause in their own text.
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    scrub(&text).into_owned()
}

/// Characters that end a URL in running text whatever comes before it: white space, quotes (a JSON
/// string's end), a backslash (a JSON escape), and angle brackets.
fn ends_any_url(c: char) -> bool {
    c.is_whitespace() || matches!(c, '"' | '\'' | '\\' | '<' | '>' | '`')
}

/// Every `scheme://…` in `text` with its userinfo, query and fragment removed. What is removed runs to
/// the end of the URL, never to the first bracket: a password or a query value may hold `)`. A URL
/// written inside brackets keeps its closing bracket.
pub fn scrub(text: &str) -> Cow<'_, str> {
    if !text.contains("://") {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(found) = rest.find("://") {
        let scheme_start = rest[..found]
            .char_indices()
            .rev()
            .take_while(|&(_, c)| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
            .last()
            .map_or(found, |(i, _)| i);
        let scheme = &rest[scheme_start..found];
        if !scheme.starts_with(|c: char| c.is_ascii_alphabetic()) {
            out.push_str(&rest[..found + 3]);
            rest = &rest[found + 3..];
            continue;
        }
        let closing = match rest[..scheme_start].chars().next_back() {
            Some('(') => Some(')'),
            Some('[') => Some(']'),
            Some('{') => Some('}'),
            _ => None,
        };
        out.push_str(&rest[..found + 3]);
        let after = &rest[found + 3..];
        let end = after.find(ends_any_url).unwrap_or(after.len());
        out.push_str(&shown_part(&after[..end], closing));
        rest = &after[end..];
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// The part of a URL after `scheme://` that may be logged: host, port and path.
fn shown_part(after_scheme: &str, closing: Option<char>) -> String {
    let authority_end = after_scheme
        .find(['/', '?', '#'])
        .unwrap_or(after_scheme.len());
    let (authority, tail) = after_scheme.split_at(authority_end);
    // The last `@` ends the userinfo: a raw `@` in a password comes before it.
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let path_end = tail.find(['?', '#']).unwrap_or(tail.len());
    let mut shown = format!("{host}{}", &tail[..path_end]);
    // The closing bracket, and punctuation after it, are the sentence's, not the query's.
    let dropped = &tail[path_end..];
    if let Some(at) = closing.and_then(|c| dropped.rfind(c)) {
        let kept = &dropped[at..];
        if kept[1..]
            .chars()
            .all(|c| matches!(c, ':' | ';' | ',' | '.'))
        {
            shown.push_str(kept);
        }
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_userinfo_query_and_fragment_and_keep_host_port_and_path() {
        for (given, shown) in [
            (
                "https://user:pw@host:8443/rpc?api_key=S#frag",
                "https://host:8443/rpc",
            ),
            ("http://127.0.0.1:9/rpc", "http://127.0.0.1:9/rpc"),
            ("http://h?x=1", "http://h"),
            (
                "postgres://app:S@db:5432/gw?sslmode=verify-full",
                "postgres://db:5432/gw",
            ),
            ("http://u:p@ss@h/x", "http://h/x"),
            ("http://[::1]:8/p?q", "http://[::1]:8/p"),
        ] {
            assert_eq!(url(given), shown, "{given}");
        }
    }

    #[test]
    fn urls_inside_error_texts_are_cleaned_to_their_end_not_their_first_bracket() {
        for (given, shown) in [
            (
                "error sending request for url (http://u:S@h:1/rpc?api_key=S): connect refused",
                "error sending request for url (http://h:1/rpc): connect refused",
            ),
            (
                "for url (http://h/p?k=a)S) failed",
                "for url (http://h/p) failed",
            ),
            ("(http://u:pa)S@h/p) x", "(http://h/p) x"),
            ("(http://h/p?k=a)S x", "(http://h/p x"),
            (
                r#"{"error":"bad url http://u:S@h/x?k=S","n":1}"#,
                r#"{"error":"bad url http://h/x","n":1}"#,
            ),
            ("no url here: a://", "no url here: a://"),
            ("1://x and ://y", "1://x and ://y"),
            ("…http://u:S@h/x", "…http://h/x"),
            (
                "two http://a@b/c?d and ws://e/f#g.",
                "two http://b/c and ws://e/f",
            ),
        ] {
            assert_eq!(scrub(given), shown, "{given}");
        }
    }

    #[test]
    fn an_error_chain_is_one_cleaned_line() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("error sending request for url (http://u:S@h/x?k=S)")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let refused = Outer(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused",
        ));
        assert_eq!(
            error(&refused),
            "error sending request for url (http://h/x): connection refused"
        );
    }
}
