//! The `domain_allowlist` check of a capability (SPEC 6.3, **domains**; a violation is code 2004).
//!
//! URLs are parsed by the WHATWG URL Standard (the `url` crate), so the host checked is the host a
//! browser-grade client would connect to: IDNA mapped to ASCII, lower-cased, numeric IPv4 forms
//! such as `0x7f.1` read as addresses, userinfo split off at the last `@`, `\` read as `/`.
//! Because a tool's own HTTP client may parse differently, values that parsers are known to
//! disagree on are refused before parsing: control characters anywhere (WHATWG silently strips
//! tabs and newlines), leading or trailing whitespace (WHATWG trims it), backslashes, userinfo
//! that itself held an `@`, and host names with characters other than letters, digits, `-`, `_`.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv6Addr};

use serde_json::{Map, Value};
use url::{Host, Url};

use super::arguments::each_value;
use super::error::{ArgumentAt, DomainProblem, RuleError, UrlProblem, Violation};
use crate::envelope::json_kind;

/// Argument keys whose values are URLs (SPEC 6.3), matched without regard to ASCII case (r3).
pub const URL_ARGUMENTS: &[&str] = &["url", "uri", "urls"];

/// A compiled `domain_allowlist`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainRule {
    /// Host names in ASCII, lower case, without a trailing dot.
    exact_hosts: BTreeSet<String>,
    /// `*.example.com` stored as `.example.com`: a host matches when it ends with it and is longer,
    /// so the dot guarantees a label boundary (`evilexample.com` never matches).
    wildcard_suffixes: Vec<String>,
    /// IP literals, matched only by an equal parsed address.
    addresses: Vec<IpAddr>,
}

/// One allowlist entry after validation.
enum Entry {
    Host(String),
    Wildcard(String),
    Address(IpAddr),
}

impl DomainRule {
    /// Compiles the rule once, at policy load. Entries are host names, `*.` wildcards over a name
    /// of at least two labels, or IP literals (IPv6 with or without brackets); anything carrying
    /// a scheme, port, path or userinfo is refused, as is `*` alone.
    pub fn new(domain_allowlist: &[String]) -> Result<DomainRule, RuleError> {
        if domain_allowlist.is_empty() {
            return Err(RuleError::EmptyAllowlist("domain_allowlist"));
        }
        let mut rule = DomainRule {
            exact_hosts: BTreeSet::new(),
            wildcard_suffixes: Vec::new(),
            addresses: Vec::new(),
        };
        for entry in domain_allowlist {
            let parsed = parse_entry(entry).map_err(|problem| RuleError::DomainEntry {
                entry: entry.clone(),
                problem,
            })?;
            match parsed {
                Entry::Host(host) => {
                    rule.exact_hosts.insert(host);
                }
                Entry::Wildcard(suffix) => {
                    if !rule.wildcard_suffixes.contains(&suffix) {
                        rule.wildcard_suffixes.push(suffix);
                    }
                }
                Entry::Address(address) => {
                    if !rule.addresses.contains(&address) {
                        rule.addresses.push(address);
                    }
                }
            }
        }
        Ok(rule)
    }

    /// Checks every URL-valued argument of one call. The error names the argument (and the array
    /// index) and the rule it broke, never the URL nor any part of it (SPEC 9.1 r2): userinfo and
    /// query strings carry secrets.
    pub fn check(&self, arguments: &Map<String, Value>) -> Result<(), Violation> {
        for (key, index, item) in each_value(arguments, URL_ARGUMENTS) {
            let at = ArgumentAt {
                key: key.to_owned(),
                index,
            };
            match item {
                Value::String(url) => self
                    .check_one(url)
                    .map_err(|problem| Violation::Url { at, problem })?,
                other => {
                    return Err(Violation::NotUrl {
                        at,
                        got: json_kind(other),
                    })
                }
            }
        }
        Ok(())
    }

    fn check_one(&self, value: &str) -> Result<(), UrlProblem> {
        if value.chars().any(char::is_control) {
            return Err(UrlProblem::Control);
        }
        if value.starts_with(char::is_whitespace) || value.ends_with(char::is_whitespace) {
            return Err(UrlProblem::Whitespace);
        }
        if value.contains('\\') {
            return Err(UrlProblem::Backslash);
        }
        let url = Url::parse(value).map_err(UrlProblem::NotAbsolute)?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(UrlProblem::Scheme);
        }
        // WHATWG percent-encodes every `@` but the last; a client splitting at the first `@`
        // would connect to a different host than the one checked here.
        if url.username().contains("%40") || url.password().is_some_and(|p| p.contains("%40")) {
            return Err(UrlProblem::AtInUserinfo);
        }
        let allowed = match url.host() {
            None => return Err(UrlProblem::NoHost),
            Some(Host::Ipv4(address)) => self.addresses.contains(&IpAddr::V4(address)),
            Some(Host::Ipv6(address)) => self.addresses.contains(&IpAddr::V6(address)),
            Some(Host::Domain(host)) => {
                let host = host.strip_suffix('.').unwrap_or(host);
                if !is_plain_host_name(host) {
                    return Err(UrlProblem::UnusualHost);
                }
                self.allows_host(host)
            }
        };
        if allowed {
            Ok(())
        } else {
            Err(UrlProblem::NotAllowed)
        }
    }

    /// `host`: ASCII, lower case, no trailing dot.
    fn allows_host(&self, host: &str) -> bool {
        self.exact_hosts.contains(host)
            || self
                .wildcard_suffixes
                .iter()
                .any(|suffix| host.len() > suffix.len() && host.ends_with(suffix.as_str()))
    }
}

fn parse_entry(entry: &str) -> Result<Entry, DomainProblem> {
    if entry.is_empty() {
        return Err(DomainProblem::Empty);
    }
    if entry.contains(|c: char| c.is_whitespace() || c.is_control()) {
        return Err(DomainProblem::Whitespace);
    }
    if entry == "*" {
        return Err(DomainProblem::Star);
    }
    if let Ok(address) = entry.parse::<IpAddr>() {
        return Ok(Entry::Address(address));
    }
    if let Some(inner) = entry.strip_prefix('[').and_then(|e| e.strip_suffix(']')) {
        return inner
            .parse::<Ipv6Addr>()
            .map(|address| Entry::Address(IpAddr::V6(address)))
            .map_err(|_| DomainProblem::NotIpv6);
    }
    if entry.contains(['/', '\\', ':', '@', '?', '#', '%', '[', ']']) {
        return Err(DomainProblem::NotBare);
    }
    if let Some(suffix) = entry.strip_prefix("*.") {
        if suffix.contains('*') {
            return Err(DomainProblem::StarInSuffix);
        }
        return match parse_host(suffix)? {
            // `*.internal` is a legitimate entry, so a single-label suffix is allowed (SPEC 6.3 forms).
            Entry::Host(name) => Ok(Entry::Wildcard(format!(".{name}"))),
            _ => Err(DomainProblem::WildcardAddress),
        };
    }
    if entry.contains('*') {
        return Err(DomainProblem::StarElsewhere);
    }
    parse_host(entry)
}

/// Normalises a host the way URL parsing does (IDNA to ASCII, lower case, IPv4 forms), then drops
/// one trailing dot.
fn parse_host(input: &str) -> Result<Entry, DomainProblem> {
    match Host::parse(input).map_err(DomainProblem::NotHost)? {
        Host::Domain(name) => {
            let name = name.strip_suffix('.').unwrap_or(&name);
            if is_plain_host_name(name) {
                Ok(Entry::Host(name.to_string()))
            } else {
                Err(DomainProblem::UnusualHost)
            }
        }
        Host::Ipv4(address) => Ok(Entry::Address(IpAddr::V4(address))),
        Host::Ipv6(address) => Ok(Entry::Address(IpAddr::V6(address))),
    }
}

/// Host names after IDNA: non-empty labels of letters, digits, `-` and `_`. WHATWG lets through
/// characters such as `,` `;` `*` `!` that other URL parsers may take as the end of the host.
fn is_plain_host_name(host: &str) -> bool {
    !host.is_empty()
        && host.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rule(entries: &[&str]) -> DomainRule {
        let entries: Vec<String> = entries.iter().map(|entry| entry.to_string()).collect();
        match DomainRule::new(&entries) {
            Ok(rule) => rule,
            Err(problem) => panic!("test allowlist {entries:?} refused: {problem}"),
        }
    }

    fn args(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            other => panic!("test arguments must be an object, got {other}"),
        }
    }

    fn url_allowed(rule: &DomainRule, url: &str) -> bool {
        rule.check(&args(json!({ "url": url }))).is_ok()
    }

    #[test]
    fn exact_hosts() {
        let example = rule(&["example.com"]);
        for allowed in [
            "https://example.com",
            "https://example.com/",
            "http://example.com/a?b=c#d",
            "HTTPS://EXAMPLE.COM/Path",
            "https://example.com./",
            "https://example.com:8443/",
            "https://user:pass@example.com/",
            "https://evil.test@example.com/",
            "https://example.com#@evil.test",
            "https://example.com?@evil.test",
            "https://exa%6Dple.com/",
            "https://example\u{3002}com/",
            "https:example.com",
            "http:///example.com",
        ] {
            assert!(url_allowed(&example, allowed), "{allowed:?} refused");
        }
        for refused in [
            "https://evilexample.com/",
            "https://example.com.evil.test/",
            "https://www.example.com/",
            "https://example.co/",
            "https://example.com@evil.test/",
            "https://example.com:443@evil.test/",
            "https://a@evil.test@example.com/",
            "https://example.com\\@evil.test/",
            "https://evil.test\\@example.com/",
            "https://exаmple.com/",
            "https://example.com../",
            "ftp://example.com/",
            "file:///etc/passwd",
            "javascript:alert(1)",
            "data:text/html,hi",
            "ws://example.com/",
            "//example.com/x",
            "example.com",
            "/path",
            "",
            " https://example.com",
            "https://example.com ",
            "https://exa\tmple.com/",
            "https://example.com/\n",
            "\u{0}https://example.com",
            "https://",
            "https:///",
            "https://:443/",
            "https://[::1]/",
            "http://127.0.0.1/",
        ] {
            assert!(!url_allowed(&example, refused), "{refused:?} allowed");
        }
    }

    #[test]
    fn wildcards_match_subdomains_only() {
        let github = rule(&["*.github.com"]);
        for allowed in [
            "https://api.github.com/",
            "https://a.b.github.com/",
            "https://API.GitHub.com./x",
            "https://my_service.github.com/",
            "https://x-1.github.com/",
        ] {
            assert!(url_allowed(&github, allowed), "{allowed:?} refused");
        }
        for refused in [
            "https://github.com/",
            "https://evilgithub.com/",
            "https://github.com.evil.test/",
            "https://api.github.com.evil.test/",
            "https://.github.com/",
            "https://a..github.com/",
            "https://*.github.com/",
            "https://evil.test,api.github.com/",
            "https://evil.test;api.github.com/",
            "https://evil.test!.github.com/",
        ] {
            assert!(!url_allowed(&github, refused), "{refused:?} allowed");
        }
    }

    #[test]
    fn internationalised_names_compare_in_ascii() {
        let unicode_entry = rule(&["bücher.example"]);
        let ascii_entry = rule(&["xn--bcher-kva.example"]);
        for check in [&unicode_entry, &ascii_entry] {
            assert!(url_allowed(check, "https://bücher.example/"));
            assert!(url_allowed(check, "https://BÜCHER.example/"));
            assert!(url_allowed(check, "https://xn--bcher-kva.example/"));
            assert!(!url_allowed(check, "https://bucher.example/"));
        }
    }

    #[test]
    fn ip_hosts_match_equal_addresses_only() {
        let loopback = rule(&["127.0.0.1", "::1"]);
        for allowed in [
            "http://127.0.0.1/",
            "http://127.0.0.1:8080/",
            "http://0x7f.1/",
            "http://2130706433/",
            "http://127.1/",
            "http://[::1]/",
            "http://[0:0:0:0:0:0:0:1]/",
        ] {
            assert!(url_allowed(&loopback, allowed), "{allowed:?} refused");
        }
        for refused in [
            "http://127.0.0.2/",
            "http://[::ffff:127.0.0.1]/",
            "http://localhost/",
            "http://127.0.0.1.nip.io/",
        ] {
            assert!(!url_allowed(&loopback, refused), "{refused:?} allowed");
        }
        let bracketed = rule(&["[2001:db8::1]"]);
        assert!(url_allowed(&bracketed, "https://[2001:DB8:0::1]/"));
        let by_name = rule(&["example.com"]);
        assert!(!url_allowed(&by_name, "http://93.184.216.34/"));
    }

    #[test]
    fn entries_are_normalised() {
        let upper = rule(&["EXAMPLE.com.", "*.Example.ORG", "0x7f.1"]);
        assert!(url_allowed(&upper, "https://example.com/"));
        assert!(url_allowed(&upper, "https://a.example.org/"));
        assert!(url_allowed(&upper, "http://127.0.0.1/"));
    }

    #[test]
    fn refuses_bad_entries() {
        assert_eq!(
            DomainRule::new(&[]).map_err(|e| e.to_string()),
            Err("empty domain_allowlist would allow nothing".to_string())
        );
        for bad in [
            "",
            "*",
            "*.",
            "*.*.example.com",
            "**.example.com",
            "*example.com",
            "a.*.example.com",
            "example.*",
            "*.127.0.0.1",
            "https://example.com",
            "example.com/path",
            "example.com:443",
            "user@example.com",
            "example.com?x",
            "example.com#x",
            "exa%6dple.com",
            "example..com",
            ".example.com",
            "example.com..",
            " example.com",
            "exa mple.com",
            "example.com\n",
            "[example.com]",
            "[::1",
            "example\\com",
            "exa,mple.com",
            "example.com;",
            "*.exa!mple.com",
        ] {
            assert!(
                DomainRule::new(&[bad.to_string()]).is_err(),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn argument_shapes() {
        let example = rule(&["example.com"]);
        let allowed = [
            json!({}),
            json!({ "href": "https://evil.test/" }),
            json!({ "URL": "https://example.com/", "link": "https://evil.test/" }),
            json!({ "urls": [] }),
            json!({ "urls": ["https://example.com/a", "http://example.com/b"] }),
            json!({ "url": "https://example.com/", "uri": "https://example.com/x" }),
        ];
        for call in allowed {
            assert!(example.check(&args(call.clone())).is_ok(), "{call} refused");
        }
        let refused = [
            json!({ "uri": "https://evil.test/" }),
            json!({ "urls": ["https://example.com/", "https://evil.test/"] }),
            json!({ "url": "https://example.com/", "urls": "https://evil.test/" }),
            json!({ "url": null }),
            json!({ "url": 1 }),
            json!({ "url": { "host": "example.com" } }),
            json!({ "urls": ["https://example.com/", 1] }),
            json!({ "urls": [["https://example.com/"]] }),
            // Names match without regard to ASCII case (SPEC 6.3 r3).
            json!({ "URL": "https://evil.test/" }),
            json!({ "Uri": "https://evil.test/" }),
            json!({ "url": "https://example.com/", "URLs": ["https://evil.test/"] }),
        ];
        for call in refused {
            assert!(
                example.check(&args(call.clone())).is_err(),
                "{call} allowed"
            );
        }
    }

    #[test]
    fn error_messages_name_argument_and_rule_never_the_url() {
        let example = rule(&["example.com"]);
        let cases = [
            (
                json!({ "url": "https://user:SECRET@evil.test/?api_key=SECRET" }),
                "argument \"url\": host not in domain_allowlist",
            ),
            (
                json!({ "urls": ["https://example.com/", "ftp://SECRET@example.com/"] }),
                "argument \"urls\"[1]: scheme other than http or https",
            ),
            (
                json!({ "uri": "//SECRET.example.com/" }),
                "argument \"uri\": not an absolute URL (relative URL without a base)",
            ),
            (
                json!({ "url": "https://a@SECRET@example.com/" }),
                "argument \"url\": '@' inside the userinfo",
            ),
            (
                json!({ "url": "https://SECRET.test,api.example.com/" }),
                "argument \"url\": empty label or unusual character in the host",
            ),
            (
                json!({ "url": "https://example.com/?k=SECRET\n" }),
                "argument \"url\": control character in the URL",
            ),
        ];
        for (call, message) in cases {
            assert_eq!(
                example
                    .check(&args(call.clone()))
                    .map_err(|e| e.to_string()),
                Err(message.to_string()),
                "{call}"
            );
        }
    }
}
