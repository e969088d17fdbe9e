//! `sealgate health`: the container's health check. The image has no curl, so the binary asks the running
//! gateway itself; Docker only looks at the exit status.

use std::process::ExitCode;
use std::time::Duration;

/// Within Docker's default 30 s health-check timeout, and short enough that a hung gateway reads as unhealthy.
const TIMEOUT: Duration = Duration::from_secs(3);

/// GET `url` (trusting the CAs of `tls`, when given): success on a 2xx answer; otherwise prints why on
/// stderr and fails.
pub async fn check(url: &str, tls: &sealgate::tls::client::ClientTls) -> ExitCode {
    // A proxy from the environment would answer for the gateway, or fail for it.
    let client = match tls.client(
        sealgate::outbound::client_builder()
            .no_proxy()
            .timeout(TIMEOUT),
    ) {
        Ok(client) => client,
        Err(e) => {
            eprintln!("unhealthy: {e}");
            return ExitCode::FAILURE;
        }
    };
    match client.get(url).send().await {
        Ok(response) if response.status().is_success() => {
            println!("healthy: {url} answered {}", response.status());
            ExitCode::SUCCESS
        }
        Ok(response) if response.status().is_redirection() => {
            // Another place's health is not this gateway's (SPEC 20 rule 8).
            let why = sealgate::outbound::failed_status(response.status(), response.headers());
            eprintln!("unhealthy: {url} answered {why}");
            ExitCode::FAILURE
        }
        Ok(response) => {
            let status = response.status();
            let body = response.text().await.unwrap_or_default();
            eprintln!("unhealthy: {url} answered {status}: {body}");
            ExitCode::FAILURE
        }
        Err(e) => {
            let why = sealgate::tls::client::failure(&e.without_url());
            eprintln!("unhealthy: cannot reach {url}: {why}");
            ExitCode::FAILURE
        }
    }
}
