//! `sealgate health`: the container's health check. The image has no curl, so the binary asks the running
//! gateway itself; Docker only looks at the exit status.

use std::process::ExitCode;
use std::time::Duration;

/// Within Docker's default 30 s health-check timeout, and short enough that a hung gateway reads as unhealthy.
const TIMEOUT: Duration = Duration::from_secs(3);

/// GET `url`: success on a 2xx answer; otherwise prints why on stderr and fails.
pub async fn check(url: &str) -> ExitCode {
    // A proxy from the environment would answer for the gateway, or fail for it.
    let client = match reqwest::Client::builder()
        .no_proxy()
        .timeout(TIMEOUT)
        .build()
    {
        Ok(client) => client,
        Err(e) => {
            eprintln!("unhealthy: cannot build an HTTP client: {e}");
            return ExitCode::FAILURE;
        }
    };
    match client.get(url).send().await {
        Ok(response) if response.status().is_success() => {
            println!("healthy: {url} answered {}", response.status());
            ExitCode::SUCCESS
        }
        Ok(response) => {
            let status = response.status();
            let body = response.text().await.unwrap_or_default();
            eprintln!("unhealthy: {url} answered {status}: {body}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("unhealthy: cannot reach {url}: {e}");
            ExitCode::FAILURE
        }
    }
}
