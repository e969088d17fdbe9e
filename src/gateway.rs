//! The running gateway: everything a request needs, built once from the configuration at start-up, and
//! the server loop with readiness, background upkeep and graceful shutdown.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::Value;

use crate::audit::{AuditEvent, AuditLog, EventType};
use crate::config::Config;
use crate::policy::{ContextRegistry, RegistryError, ReloadEvent, SecurityContext, WatcherHandle};
use crate::session::SessionCache;
use crate::store::postgres::CONTEXT_POLL;
use crate::store::{PgStore, Shelf, SqliteStore, Store, StoredContext, StoredContexts};
use crate::token::{AgentTokenVerifier, OperatorVerifier, TokenMinter};
use crate::upstream::Upstreams;

pub struct Gateway {
    config: Arc<Config>,
    store: Arc<dyn Store>,
    /// Sessions decoded in memory; revocation invalidates (SPEC 5: refused from that moment).
    sessions: Arc<SessionCache>,
    /// `/v1/invoke` calls in progress; none left → 5006 at once (SPEC 11 r2 admission control).
    call_slots: Arc<tokio::sync::Semaphore>,
    contexts: Arc<ContextRegistry>,
    /// The comparisons of calls' decisions with their contexts' shadow versions (SPEC 6.4 r4).
    shadows: Arc<crate::shadow::Tallies>,
    agent_tokens: AgentTokenVerifier,
    operators: OperatorVerifier,
    /// OpenID Connect sign-in, roles and console sessions (SPEC 16), when `operator_auth.oidc` is set.
    oidc: Option<Arc<crate::identity::Oidc>>,
    /// The MCP endpoint for hosts over the network (SPEC 17), when `mcp_server.enabled`.
    mcp_server: Option<crate::mcp_server::McpServer>,
    minter: Option<Arc<TokenMinter>>,
    upstreams: Upstreams,
    /// The pinned definitions of the MCP upstreams' tools (SPEC 18), checked on every call.
    tools: crate::tools::Pins,
    /// The gateway-wide answer guard (SPEC 18); a capability's `answer_guard` wins over it.
    answer_guard: crate::guard::Guard,
    audit: AuditLog,
    metrics: PrometheusHandle,
    /// The approval requests: their store, audit trail and webhook (SPEC 13).
    approvals: crate::approval::Desk,
    /// Signs receipts and audit checkpoints; publishes `/v1/keys` (SPEC 14).
    evidence: Arc<crate::evidence::Evidence>,
    /// The clock window that the store's replay records cover (SPEC 20 rule 3), checked with check 8.
    replay_cover: crate::replay::ReplayCover,
    /// Keeps the policy folder watched for as long as the gateway lives.
    _policy_watcher: WatcherHandle,
}

/// Each part of the gateway, read-only: handlers and rooms take the parts they use.
impl Gateway {
    /// The configuration it was built from.
    pub fn config(&self) -> &Arc<Config> {
        &self.config
    }

    /// The durable state (SPEC 12).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Sessions decoded in memory.
    pub fn sessions(&self) -> &Arc<SessionCache> {
        &self.sessions
    }

    /// `/v1/invoke` calls in progress (SPEC 11 r2 admission control).
    pub fn call_slots(&self) -> &Arc<tokio::sync::Semaphore> {
        &self.call_slots
    }

    /// The security contexts in force, with their shadow versions.
    pub fn contexts(&self) -> &Arc<ContextRegistry> {
        &self.contexts
    }

    /// The counts of calls decided by shadow versions (SPEC 6.4 r4).
    pub fn shadows(&self) -> &Arc<crate::shadow::Tallies> {
        &self.shadows
    }

    /// Verifies agents' JWTs (checks 2–4).
    pub fn agent_tokens(&self) -> &AgentTokenVerifier {
        &self.agent_tokens
    }

    /// Verifies operators' tokens.
    pub fn operators(&self) -> &OperatorVerifier {
        &self.operators
    }

    /// OpenID Connect sign-in (SPEC 16), when configured.
    pub fn oidc(&self) -> &Option<Arc<crate::identity::Oidc>> {
        &self.oidc
    }

    /// The MCP endpoint (SPEC 17), when enabled.
    pub fn mcp_server(&self) -> &Option<crate::mcp_server::McpServer> {
        &self.mcp_server
    }

    /// Mints agent tokens, when an issuer key is configured.
    pub fn minter(&self) -> &Option<Arc<TokenMinter>> {
        &self.minter
    }

    /// The tools' servers.
    pub fn upstreams(&self) -> &Upstreams {
        &self.upstreams
    }

    /// The pinned tool definitions (SPEC 18).
    pub fn tools(&self) -> &crate::tools::Pins {
        &self.tools
    }

    /// The gateway-wide answer guard (SPEC 18).
    pub fn answer_guard(&self) -> &crate::guard::Guard {
        &self.answer_guard
    }

    /// The audit trail.
    pub fn audit(&self) -> &AuditLog {
        &self.audit
    }

    /// The Prometheus registry `/metrics` renders.
    pub fn metrics(&self) -> &PrometheusHandle {
        &self.metrics
    }

    /// Receipts, checkpoints and `/v1/keys` (SPEC 14).
    pub fn evidence(&self) -> &Arc<crate::evidence::Evidence> {
        &self.evidence
    }

    /// The clock window the store's replay records cover (SPEC 20 rule 3).
    pub fn replay_cover(&self) -> &crate::replay::ReplayCover {
        &self.replay_cover
    }
}

impl Gateway {
    /// Builds every part from the configuration; any invalid part stops start-up with a precise message.
    pub async fn build(config: Config) -> Result<Arc<Gateway>, String> {
        if config.store != "embedded" {
            // Config validation admits only postgres:// and postgresql:// URLs besides "embedded".
            let store = Arc::new(
                PgStore::connect(&config.store)
                    .await
                    .map_err(|e| format!("store: {e}"))?,
            );
            let (gateway, loaded) = Gateway::assemble(config, store.clone()).await?;
            // A session revoked through another replica leaves this one's cache within 1 s (SPEC 12).
            let weak = Arc::downgrade(&gateway);
            store
                .watch_sessions(move |session_id| match weak.upgrade() {
                    Some(gateway) => {
                        gateway.sessions.invalidate(session_id);
                        true
                    }
                    None => false,
                })
                .await
                .map_err(|e| format!("store: {e}"))?;
            // Tool definitions accepted through another replica apply here within 2 s (SPEC 18).
            spawn_pin_poll(&gateway);
            // Contexts put or deleted through another replica's API apply here within 2 s (SPEC 12).
            spawn_context_poll(&gateway, store, loaded);
            return Ok(gateway);
        }
        let data_dir = config.resolve(&config.data_dir);
        crate::files::private_dir(&data_dir)?;
        let store: Arc<dyn Store> = {
            let dir = data_dir.clone();
            let opened = tokio::task::spawn_blocking(move || SqliteStore::open(&dir))
                .await
                .map_err(|e| e.to_string())?;
            Arc::new(opened.map_err(|e| e.to_string())?)
        };
        Gateway::build_with_store(config, store).await
    }

    /// Builds the gateway on a store that is already open (the embedded one, or another
    /// implementation of the trait).
    pub async fn build_with_store(
        config: Config,
        store: Arc<dyn Store>,
    ) -> Result<Arc<Gateway>, String> {
        Ok(Gateway::assemble(config, store).await?.0)
    }

    /// Builds the gateway, and returns with it the store contexts that start-up read, which a
    /// replica's context poll diffs its first answer against.
    async fn assemble(
        config: Config,
        store: Arc<dyn Store>,
    ) -> Result<(Arc<Gateway>, StoredContexts), String> {
        // Before anything registers a metric handle (the upstreams do).
        let metrics = crate::telemetry::install();
        // Their errors name their own keys (`agent_tokens.keys[0]: …`), as `serve --check` prints them.
        let agent_tokens = AgentTokenVerifier::new(&config.agent_tokens, &config.base_dir)
            .map_err(|e| e.to_string())?;
        let operators = OperatorVerifier::new(&config.operator_auth, &config.base_dir)
            .map_err(|e| e.to_string())?;
        // Key sets at JWKS URLs: fetched once now (a failure is retried, and /readyz waits for it).
        tokio::join!(
            agent_tokens.key_set().start_fetching(),
            operators.key_set().start_fetching()
        );
        let oidc = crate::token::relying_party(
            &config.operator_auth,
            &config.base_dir,
            config.limits.max_clock_skew_secs.unsigned_abs(),
        )?;
        let mcp_server = crate::mcp_server::McpServer::new(
            &config.mcp_server,
            &config.mcp_server_surroundings(),
        )?;
        let minter = TokenMinter::from_config(&config.agent_tokens, &config.base_dir)
            .map_err(|e| e.to_string())?;
        let upstreams = Upstreams::new(&config.upstreams).map_err(|e| format!("upstreams: {e}"))?;
        let answer_guard = crate::guard::Guard::new(&config.answer_guard).map_err(|refused| {
            format!(
                "answer_guard.secret_patterns.{}: {}",
                refused.name, refused.reason
            )
        })?;
        let notifier = crate::approval::Notifier::new(&config.approvals)?;

        let policies_dir = config.policies_folder()?;
        let contexts =
            Arc::new(ContextRegistry::load(&policies_dir).map_err(|e| format!("policies: {e}"))?);
        let stored = StoredContexts {
            live: store
                .context_list(Shelf::Live)
                .await
                .map_err(|e| e.to_string())?,
            shadows: store
                .context_list(Shelf::Shadow)
                .await
                .map_err(|e| e.to_string())?,
        };
        for (shelf, list) in [
            (Shelf::Live, &stored.live),
            (Shelf::Shadow, &stored.shadows),
        ] {
            for context in list {
                if let Err(e) = put_stored(&contexts, shelf, &context.spec) {
                    tracing::error!(context = %context.name, ?shelf, error = %e, "stored security context no longer loads; skipped");
                }
            }
        }
        let restored = crate::recovery::restore(
            store.as_ref(),
            &contexts,
            config.limits.max_clock_skew_secs,
            crate::clock::now_millis(),
        )
        .await
        .map_err(|e| format!("store: {e}"))?;
        if restored.events_read > 0 {
            tracing::info!(
                events = restored.events_read,
                signatures = restored.signatures,
                rate_admissions = restored.rate_admissions,
                "replay records and rate windows restored from the audit chain"
            );
        }
        // The store's cover before this start, and this start's, recorded before any call is taken.
        let replay_cover = crate::replay::ReplayCover::at_start(
            store
                .replay_cover()
                .await
                .map_err(|e| format!("store: {e}"))?,
            config.limits.max_clock_skew_secs,
            crate::clock::now_millis(),
        );
        store
            .set_replay_cover(&replay_cover)
            .await
            .map_err(|e| format!("store: {e}"))?;
        if let Some(narrowed) = replay_cover.narrowed {
            tracing::warn!(
                covered_secs = narrowed.secs,
                until_ms = narrowed.until_ms,
                "max_clock_skew_secs is wider than the replay records cover: older envelopes get 1007 until the wider window has passed"
            );
        }
        // Nothing here stops start-up (keys can be added and tools installed later), but each is a
        // feature that cannot work as configured, said once now rather than at the first refusal.
        let problems = crate::config_check::unusable_features(&config, contexts.list().len())
            .into_iter()
            .chain(crate::config_check::launch_problems(&config));
        for problem in problems {
            tracing::warn!("{problem}");
        }

        let audit_cfg = crate::audit::AuditConfig {
            file: config.audit.file.as_ref().map(|f| config.resolve(f)),
            ..config.audit.clone()
        };
        let evidence =
            crate::evidence::Evidence::start(&config.signing_setup(), store.as_ref()).await?;
        let options = crate::audit::WriterOptions {
            replica: Some(config.replica_id.clone()),
            checkpoints: Some(evidence.checkpoint_options(&config.audit)),
            ..crate::audit::WriterOptions::default()
        };
        // A networked store is shared by replicas: the audit file is then this replica's own log.
        let audit = if config.store == "embedded" {
            AuditLog::start_with(store.clone(), &audit_cfg, options).await
        } else {
            AuditLog::start_shared(store.clone(), &audit_cfg, options).await
        }
        .map_err(|e| format!("audit: {e}"))?;

        let tools = crate::tools::Pins::new(
            store.clone(),
            audit.clone(),
            &upstreams.pinned(),
            store.tool_pins().await.map_err(|e| format!("store: {e}"))?,
        )?;
        let policy_watcher = watch_policies(&contexts, &audit, policies_dir)?;
        let shadows = Arc::new(crate::shadow::Tallies::new(store.clone()));
        let gateway = Arc::new(Gateway {
            call_slots: Arc::new(tokio::sync::Semaphore::new(
                config.limits.max_concurrent_calls,
            )),
            config: Arc::new(config),
            approvals: crate::approval::Desk {
                store: store.clone(),
                audit: audit.clone(),
                notifier: Arc::new(notifier),
            },
            store,
            sessions: Arc::default(),
            contexts,
            shadows,
            agent_tokens,
            operators,
            oidc: oidc.map(Arc::new),
            mcp_server,
            minter: minter.map(Arc::new),
            upstreams,
            tools,
            answer_guard,
            audit,
            metrics,
            evidence: Arc::new(evidence),
            replay_cover,
            _policy_watcher: policy_watcher,
        });
        gateway.spawn_upkeep();
        gateway.spawn_relisting();
        Ok((gateway, stored))
    }
}

/// Reads the tool pins every [`CONTEXT_POLL`], so that a definition accepted through another replica is
/// callable here too (the check on a call reads memory only).
fn spawn_pin_poll(gateway: &Arc<Gateway>) {
    if gateway.upstreams.pinned().is_empty() {
        return;
    }
    let gateway = Arc::downgrade(gateway);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(CONTEXT_POLL);
        loop {
            tick.tick().await;
            let Some(gateway) = gateway.upgrade() else {
                return;
            };
            match gateway.store.tool_pins().await {
                Ok(pins) => gateway.tools.apply(pins),
                Err(e) => tracing::warn!(error = %e, "could not poll the tool pins"),
            }
        }
    });
}

/// Polls the store's change counter every [`CONTEXT_POLL`] and applies what other replicas changed, the
/// contexts and their shadow versions. Each poll reads and applies in one turn of
/// [`ContextRegistry::store_change_turn`], so that it never interleaves with this replica's own API changes.
fn spawn_context_poll(gateway: &Arc<Gateway>, store: Arc<PgStore>, loaded: StoredContexts) {
    let gateway = Arc::downgrade(gateway);
    tokio::spawn(async move {
        let mut previous = [stored_specs(loaded.live), stored_specs(loaded.shadows)];
        let mut seen = None;
        let mut tick = tokio::time::interval(CONTEXT_POLL);
        loop {
            tick.tick().await;
            let Some(gateway) = gateway.upgrade() else {
                return;
            };
            let _turn = gateway.contexts.store_change_turn().await;
            match store.contexts_if_changed(seen).await {
                Ok(None) => {}
                Ok(Some((version, polled))) => {
                    let [live, shadows] = &mut previous;
                    apply_polled(&gateway.contexts, Shelf::Live, live, polled.live);
                    apply_polled(&gateway.contexts, Shelf::Shadow, shadows, polled.shadows);
                    seen = Some(version);
                }
                // Polled again at the next tick; the calls themselves fail closed meanwhile.
                Err(e) => tracing::warn!(error = %e, "could not poll the stored security contexts"),
            }
        }
    });
}

fn stored_specs(contexts: Vec<StoredContext>) -> BTreeMap<String, Value> {
    contexts.into_iter().map(|c| (c.name, c.spec)).collect()
}

/// Puts a stored context, or shadow version, into the registry.
fn put_stored(contexts: &ContextRegistry, shelf: Shelf, spec: &Value) -> Result<(), String> {
    let context = crate::policy::parse_context_json(spec).map_err(|e| e.to_string())?;
    apply_stored(contexts, shelf, context)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Puts a context kept in the store, or a shadow version, into the registry; returns what it replaced.
pub(crate) fn apply_stored(
    contexts: &ContextRegistry,
    shelf: Shelf,
    context: SecurityContext,
) -> Result<Option<Arc<SecurityContext>>, RegistryError> {
    match shelf {
        Shelf::Live => contexts.put_store_context(context),
        Shelf::Shadow => contexts.put_store_shadow(context),
    }
}

/// Removes a context kept in the store, or a shadow version, from the registry.
pub(crate) fn remove_stored(
    contexts: &ContextRegistry,
    shelf: Shelf,
    name: &str,
) -> Result<Arc<SecurityContext>, RegistryError> {
    match shelf {
        Shelf::Live => contexts.remove_store_context(name),
        Shelf::Shadow => contexts.remove_store_shadow(name),
    }
}

/// Applies the store's API-managed contexts (or shadows) as polled: puts what is new or changed since the
/// previous poll and removes what is gone. The first poll is diffed against what start-up loaded, and
/// every poll against the one before, never against the registry, which also holds this replica's own
/// changes.
fn apply_polled(
    contexts: &ContextRegistry,
    shelf: Shelf,
    previous: &mut BTreeMap<String, Value>,
    polled: Vec<StoredContext>,
) {
    let polled = stored_specs(polled);
    let gone: Vec<String> = previous
        .keys()
        .filter(|name| !polled.contains_key(*name))
        .cloned()
        .collect();
    for name in gone {
        match remove_stored(contexts, shelf, &name) {
            Ok(_) => {
                tracing::info!(context = %name, ?shelf, "stored security context removed by another replica")
            }
            // Already removed here (this replica's own API call).
            Err(RegistryError::NotFound(_)) => {}
            Err(e) => {
                tracing::error!(context = %name, ?shelf, error = %e, "stored security context removal not applied")
            }
        }
    }
    for (name, spec) in &polled {
        if previous.get(name) == Some(spec) {
            continue;
        }
        match put_stored(contexts, shelf, spec) {
            Ok(()) => tracing::debug!(context = %name, ?shelf, "stored security context applied"),
            Err(e) => {
                tracing::error!(context = %name, ?shelf, error = %e, "stored security context no longer loads; skipped")
            }
        }
    }
    *previous = polled;
}

/// The `detail` of the `SecurityContextChanged` events that say a shadow version was set or removed
/// (SPEC 6.4 r4); their `context_version` is the shadow's.
pub const SHADOW_SET: &str = "shadow set";
pub const SHADOW_REMOVED: &str = "shadow removed";

/// Hot reload: applied changes and refused files both leave an audit event.
fn watch_policies(
    contexts: &Arc<ContextRegistry>,
    audit: &AuditLog,
    dir: std::path::PathBuf,
) -> Result<WatcherHandle, String> {
    let audit = audit.clone();
    let handle = tokio::runtime::Handle::current();
    contexts.clone().spawn_watcher(dir, move |event| {
            let record = match event {
                ReloadEvent::Changed { name, version, team, .. } => {
                    tracing::info!(context = %name, %version, "security context reloaded");
                    AuditEvent::new(EventType::SecurityContextChanged)
                        .scp(&name)
                        .context_version(&version)
                        .team(team)
                }
                ReloadEvent::Removed { name, team } => {
                    tracing::info!(context = %name, "security context removed");
                    AuditEvent::new(EventType::SecurityContextChanged)
                        .scp(&name)
                        .detail("removed")
                        .team(team)
                }
                ReloadEvent::ShadowChanged { name, version, team, .. } => {
                    tracing::info!(context = %name, %version, "shadow version reloaded");
                    AuditEvent::new(EventType::SecurityContextChanged)
                        .scp(&name)
                        .context_version(&version)
                        .detail(SHADOW_SET)
                        .team(team)
                }
                ReloadEvent::ShadowRemoved { name, team } => {
                    tracing::info!(context = %name, "shadow version removed");
                    AuditEvent::new(EventType::SecurityContextChanged)
                        .scp(&name)
                        .detail(SHADOW_REMOVED)
                        .team(team)
                }
                ReloadEvent::Rejected { file, error } => {
                    tracing::error!(file = %file.display(), %error, "policy file refused; the last good version stays in force");
                    AuditEvent::new(EventType::SecurityContextRejected)
                        .detail(format!("{}: {error}", file.display()))
                }
            };
            let audit = audit.clone();
            handle.spawn(async move {
                if let Err(e) = audit.record(record).await {
                    tracing::error!(error = %e, "could not record a policy reload event");
                }
            });
        })
}

impl Gateway {
    /// Forgets replay records whose window has passed and folds pending histogram samples, so neither the
    /// store nor memory grows without bound, and expires approval requests and grants whose time ran out
    /// (SPEC 13: within 60 s).
    fn spawn_upkeep(self: &Arc<Self>) {
        let gateway = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(crate::approval::SWEEP_EVERY);
            loop {
                tick.tick().await;
                let Some(gateway) = gateway.upgrade() else {
                    break;
                };
                if let Err(e) = crate::approval::sweep(gateway.approvals()).await {
                    tracing::warn!(error = %e, "could not expire overdue approvals");
                }
            }
        });
        let retention = crate::retention::Retention::from_config(
            &self.config.retention,
            self.config.archive_path(),
            &self.config.replica_id,
            crate::retention::StillNeeded {
                skew_secs: self.config.limits.max_clock_skew_secs,
                contexts: self.contexts.clone(),
            },
        );
        if let Some(retention) = retention {
            crate::retention::spawn(Arc::downgrade(&self.store), retention);
        }
        let gateway = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(crate::shadow::FLUSH_EVERY);
            loop {
                tick.tick().await;
                let Some(gateway) = gateway.upgrade() else {
                    break;
                };
                if let Err(e) = gateway.shadows.flush().await {
                    tracing::warn!(error = %e, "could not add the shadow tallies to the store's");
                }
            }
        });
        let store = Arc::downgrade(&self.store);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(10));
            loop {
                tick.tick().await;
                let Some(store) = store.upgrade() else { break };
                if let Err(e) = store.purge_signatures(crate::clock::now_millis()).await {
                    tracing::warn!(error = %e, "could not purge expired replay records");
                }
                crate::telemetry::fold_samples();
            }
        });
    }

    /// Lists the tools again whenever an MCP upstream says they changed, so that a changed definition is
    /// withheld (and its event written) before any host lists or calls it (SPEC 18).
    fn spawn_relisting(self: &Arc<Self>) {
        if self.upstreams.pinned().is_empty() {
            return;
        }
        let changes = self.upstreams.tool_list_changes();
        let gateway = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                changes.notified().await;
                let Some(gateway) = gateway.upgrade() else {
                    return;
                };
                gateway.listed_tools().await;
            }
        });
    }

    /// Every upstream's tools, without the withheld ones: the upstreams' lists, screened against the
    /// pins (SPEC 18).
    pub async fn listed_tools(&self) -> crate::upstream::ToolList {
        let list = self.upstreams.list_tools().await;
        self.screened(list, self.upstreams.pinned().into_keys().collect())
            .await
    }

    /// `list` without its withheld tools, its `upstreams` (those of them that listed) observed whole.
    async fn screened(
        &self,
        mut list: crate::upstream::ToolList,
        upstreams: Vec<String>,
    ) -> crate::upstream::ToolList {
        let listed: Vec<String> = upstreams
            .into_iter()
            .filter(|name| !list.left_out.iter().any(|left| &left.upstream == name))
            .collect();
        list.tools = self.tools.screen(list.tools, &listed).await;
        list
    }

    /// Lists the tool's upstream when this process has not listed it yet (SPEC 18), so that no call or
    /// accept is judged without its tool's definition.
    pub async fn observe_upstream_of(&self, tool: &str) {
        if self.tools.unobserved(tool) {
            let upstream = tool.split_once('.').map_or(tool, |(upstream, _)| upstream);
            let list = self.upstreams.list_tools_of(upstream).await;
            self.screened(list, vec![upstream.to_owned()]).await;
        }
    }

    /// SPEC 18's check of a call, before anything is sent; in memory once the upstream was listed.
    pub async fn check_tool(&self, tool: &str) -> Result<(), crate::tools::Withheld> {
        self.observe_upstream_of(tool).await;
        self.tools.check(tool)
    }

    /// The store, audit trail and webhook that the approval steps work with.
    pub fn approvals(&self) -> &crate::approval::Desk {
        &self.approvals
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stored(name: &str, tool: &str) -> StoredContext {
        StoredContext {
            name: name.into(),
            spec: json!({"name": name, "capabilities": [{"tool_pattern": tool}]}),
        }
    }

    fn put(contexts: &ContextRegistry, context: &StoredContext) {
        let parsed = crate::policy::parse_context_json(&context.spec).unwrap();
        contexts.put_store_context(parsed).unwrap();
    }

    fn names(contexts: &ContextRegistry) -> Vec<String> {
        let mut names: Vec<String> = contexts
            .list()
            .iter()
            .map(|c| c.name().to_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_poll_read_before_this_replicas_put_does_not_undo_it() {
        let contexts = ContextRegistry::new();
        let kept = stored("kept", "a.*");
        put(&contexts, &kept);
        let mut previous = stored_specs(vec![kept.clone()]);
        // The poll read the store, then this replica's API stored and applied "fresh".
        put(&contexts, &stored("fresh", "b.*"));
        apply_polled(&contexts, Shelf::Live, &mut previous, vec![kept.clone()]);
        assert_eq!(names(&contexts), ["fresh", "kept"]);
        // The next poll sees it stored, and keeps it.
        apply_polled(
            &contexts,
            Shelf::Live,
            &mut previous,
            vec![kept, stored("fresh", "b.*")],
        );
        assert_eq!(names(&contexts), ["fresh", "kept"]);
    }

    #[test]
    fn changes_from_another_replica_apply_and_removals_remove() {
        let contexts = ContextRegistry::new();
        let (a, b) = (stored("a", "a.*"), stored("b", "b.*"));
        put(&contexts, &a);
        put(&contexts, &b);
        let mut previous = stored_specs(vec![a, b]);
        let changed = stored("a", "changed.*");
        apply_polled(
            &contexts,
            Shelf::Live,
            &mut previous,
            vec![changed, stored("c", "c.*")],
        );
        assert_eq!(names(&contexts), ["a", "c"]);
        let a = contexts.get("a").unwrap();
        assert!(a.capabilities[0].pattern.matches("changed.x"));
    }
}
