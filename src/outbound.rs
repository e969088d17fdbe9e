//! What every HTTP client that sealgate opens towards another server shares (SPEC 20 rule 8): it never
//! follows a redirect. A redirect would carry what the request holds (an upstream's credential headers,
//! a signed envelope and its token, an approval's details) to a place nobody configured, so a 3xx is a
//! failure that names its status and where it pointed.

use reqwest::header::{HeaderMap, LOCATION};
use reqwest::StatusCode;

/// A client builder that follows no redirect; each caller adds its own timeouts, TLS and proxy choice.
pub fn client_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none())
}

/// `https://`, or `http://` on a loopback host only, where nobody else can answer or read what is sent.
/// The reason names neither the URL nor its query (which may hold a credential): the caller prefixes
/// what it was.
pub(crate) fn https_or_loopback(url: &url::Url) -> Result<(), String> {
    match url.scheme() {
        "https" => Ok(()),
        "http" if is_loopback_host(url) => Ok(()),
        "http" => Err(
            "http:// is accepted only for a loopback host (127.0.0.1, [::1], localhost); use https://"
                .to_owned(),
        ),
        other => Err(format!("the scheme is {other:?}; use https://")),
    }
}

/// Whether `url`'s host is this machine (127.0.0.0/8, [::1], localhost), where nobody else can answer
/// a plain `http://` request.
pub(crate) fn is_loopback_host(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(name)) => name == "localhost",
        None => false,
    }
}

/// The certificates of a `ca_file`: the only authorities a client configured with it trusts.
pub(crate) fn read_ca_file(path: &std::path::Path) -> Result<Vec<reqwest::Certificate>, String> {
    let pem = std::fs::read(path)
        .map_err(|err| format!("ca_file: cannot read {}: {err}", path.display()))?;
    let certificates = reqwest::Certificate::from_pem_bundle(&pem)
        .map_err(|err| format!("ca_file {}: not a PEM bundle: {err}", path.display()))?;
    if certificates.is_empty() {
        return Err(format!("ca_file {}: holds no certificate", path.display()));
    }
    Ok(certificates)
}

/// A failed answer's status as a message says it: `HTTP 500 Internal Server Error`, and for a 3xx
/// where it pointed, `HTTP 307 Temporary Redirect to https://other.example/hook (redirects are not
/// followed)`. The `Location` is shown as logs show URLs: no userinfo, query or fragment (SPEC 9.1 r3).
pub fn failed_status(status: StatusCode, headers: &HeaderMap) -> String {
    if !status.is_redirection() {
        return format!("HTTP {status}");
    }
    let target = match headers.get(LOCATION) {
        Some(location) => format!(
            "to {}",
            shown_location(&String::from_utf8_lossy(location.as_bytes()))
        ),
        None => "without a Location".to_owned(),
    };
    format!("HTTP {status} {target} (redirects are not followed)")
}

/// A relative `Location` has no scheme for [`crate::redact::url`] to find, so its query and fragment
/// are cut here first.
fn shown_location(location: &str) -> String {
    let end = location.find(['?', '#']).unwrap_or(location.len());
    crate::redact::url(&location[..end])
}

/// Why a capped body read stopped.
#[derive(Debug)]
pub(crate) enum CappedReadError {
    /// More than the cap arrived (or was announced by Content-Length).
    TooLarge,
    /// The connection failed before the body was complete.
    Body(reqwest::Error),
}

/// Reads a response body, never holding more than `cap` bytes plus the chunk in hand.
pub(crate) async fn read_capped(
    mut response: reqwest::Response,
    cap: u64,
) -> Result<Vec<u8>, CappedReadError> {
    if response
        .content_length()
        .is_some_and(|announced| announced > cap)
    {
        return Err(CappedReadError::TooLarge);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(CappedReadError::Body)? {
        let total = body.len() as u64 + chunk.len() as u64;
        if total > cap {
            return Err(CappedReadError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn located(location: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(LOCATION, HeaderValue::from_str(location).unwrap());
        headers
    }

    #[test]
    fn a_redirect_names_its_status_and_where_it_pointed_without_secrets() {
        assert_eq!(
            failed_status(
                StatusCode::TEMPORARY_REDIRECT,
                &located("https://user:pw@other.example:8443/hook?token=S#f")
            ),
            "HTTP 307 Temporary Redirect to https://other.example:8443/hook \
             (redirects are not followed)"
        );
        assert_eq!(
            failed_status(StatusCode::FOUND, &located("/elsewhere?key=S")),
            "HTTP 302 Found to /elsewhere (redirects are not followed)"
        );
        assert_eq!(
            failed_status(StatusCode::PERMANENT_REDIRECT, &HeaderMap::new()),
            "HTTP 308 Permanent Redirect without a Location (redirects are not followed)"
        );
    }

    #[test]
    fn other_statuses_are_named_alone() {
        assert_eq!(
            failed_status(StatusCode::BAD_GATEWAY, &located("https://x/")),
            "HTTP 502 Bad Gateway"
        );
    }
}
