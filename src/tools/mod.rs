//! Pinned tool definitions (SPEC 18, first half): what each MCP upstream offers, as seen and as accepted.
//!
//! Every time an MCP upstream's tools are listed, each tool's definition (its `name`, `title`,
//! `description`, `inputSchema`, `outputSchema` and `annotations`, as the upstream wrote them) is hashed
//! and compared with the tool's pin. A tool whose definition is not the pinned one — changed, new under
//! `reviewed`, or holding hidden characters or denylisted text — is withheld: left out of `tools/list`
//! and its calls refused with 2009, until an operator accepts the definition seen.
//!
//! Pins live in the store (shared by replicas) and in memory here, so that checking a call reads no
//! store. A replica learns of another's accept by [`Pins::apply`] (a poll of the store). Each withheld
//! definition is recorded once in the store's sightings, and only the replica whose sighting was the
//! first writes its `ToolDefinitionChanged` event. This room lists nothing and forwards nothing: it is
//! shown what the upstreams listed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, RwLock};

use regex_automata::meta::Regex;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::audit::{AuditEvent, AuditLog, EventType};
use crate::identity::Identity;
use crate::store::{RecordedIdentity, Store, ToolPin};

/// The fields of a listed tool that make its definition (SPEC 18); others (`_meta`, `icons`) do not.
const DEFINITION_FIELDS: [&str; 6] = [
    "name",
    "title",
    "description",
    "inputSchema",
    "outputSchema",
    "annotations",
];

/// An upstream's `tools:` settings.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ToolsConfig {
    /// `first_use` (a tool seen for the first time is pinned as it is) or `reviewed` (withheld until
    /// accepted).
    #[serde(default)]
    pub pin: PinMode,
    /// Regular expressions (the `regex` crate's syntax, linear time); a tool whose description matches
    /// one is withheld until accepted.
    #[serde(default)]
    pub description_denylist: Vec<String>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PinMode {
    #[default]
    FirstUse,
    Reviewed,
}

/// An upstream's rules, compiled.
struct Rules {
    mode: PinMode,
    denylist: Vec<Regex>,
    /// Held while a list of this upstream is taken in.
    observing: tokio::sync::Mutex<()>,
}

/// Compiles a denylist; the error names the key and the pattern the `regex` crate refused.
pub fn compile_denylist(upstream: &str, patterns: &[String]) -> Result<Vec<Regex>, String> {
    patterns
        .iter()
        .enumerate()
        .map(|(i, pattern)| {
            Regex::new(pattern).map_err(|e| {
                format!("upstreams.{upstream}.tools.description_denylist[{i}]: {pattern:?} is not a usable pattern: {e}")
            })
        })
        .collect()
}

/// Why a tool is withheld (the `reason` of 2009's details).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Its definition differs from the pinned one.
    Changed,
    /// Seen for the first time under `pin: reviewed` (or its first pin could not be written).
    New,
    /// Its name, title or description holds a Unicode format (Cf) character.
    HiddenCharacters,
    /// Its description matches one of the upstream's `description_denylist` patterns.
    DenylistedText,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Changed => "changed",
            Reason::New => "new",
            Reason::HiddenCharacters => "hidden_characters",
            Reason::DenylistedText => "denylisted_text",
        }
    }
}

/// A call refused because its tool is withheld: 2009's details.
#[derive(Debug, Clone, PartialEq)]
pub struct Withheld {
    /// The tool as routed (`upstream.tool`).
    pub tool: String,
    pub pinned_sha256: Option<String>,
    /// None when no definition of it was seen (an unlisted tool under `pin: reviewed`).
    pub seen_sha256: Option<String>,
    pub reason: Reason,
}

impl Withheld {
    pub fn details(&self) -> Value {
        json!({
            "tool": self.tool,
            "pinned_sha256": self.pinned_sha256,
            "seen_sha256": self.seen_sha256,
            "reason": self.reason.as_str(),
        })
    }

    pub fn message(&self) -> String {
        match self.reason {
            Reason::Changed => format!(
                "the definition of {} changed since it was pinned; it is withheld until an operator accepts it",
                self.tool
            ),
            Reason::New => format!("{} is new and withheld until an operator accepts it", self.tool),
            Reason::HiddenCharacters => format!(
                "the definition of {} holds hidden (format) characters; it is withheld until an operator accepts it",
                self.tool
            ),
            Reason::DenylistedText => format!(
                "the description of {} matches the upstream's description_denylist; it is withheld until an operator accepts it",
                self.tool
            ),
        }
    }
}

/// A definition as listed, with its hash and what its text holds.
#[derive(Debug, Clone)]
struct Seen {
    definition: Value,
    sha256: String,
    flag: Option<Reason>,
}

#[derive(Debug, Default)]
struct Entry {
    pin: Option<ToolPin>,
    seen: Option<Seen>,
}

impl Entry {
    /// Why calls to this tool are refused; None when its seen definition is the pinned one (or it has
    /// not been seen: the upstream does not list it, and answers for itself).
    fn withheld(&self, routed: &str) -> Option<Withheld> {
        let seen = self.seen.as_ref()?;
        let pinned = self.pin.as_ref().map(|pin| pin.definition_sha256.clone());
        if pinned.as_deref() == Some(seen.sha256.as_str()) {
            return None;
        }
        // Without a pin: `reviewed`, or under `first_use` a first pin that could not be written.
        let reason = seen.flag.unwrap_or(if pinned.is_some() {
            Reason::Changed
        } else {
            Reason::New
        });
        Some(Withheld {
            tool: routed.to_owned(),
            pinned_sha256: pinned,
            seen_sha256: Some(seen.sha256.clone()),
            reason,
        })
    }

    fn status(&self) -> &'static str {
        match (&self.pin, &self.seen) {
            (None, _) => "new",
            (Some(pin), Some(seen)) if pin.definition_sha256 != seen.sha256 => "changed",
            (Some(_), _) => "pinned",
        }
    }
}

#[derive(Default)]
struct State {
    /// By upstream, then by the upstream's own tool name.
    tools: HashMap<String, HashMap<String, Entry>>,
    /// Upstreams whose tools were listed at least once by this process.
    observed: HashSet<String>,
    /// Withheld definitions (upstream, tool, sha256) whose sighting this process has written.
    reported: HashSet<(String, String, String)>,
}

/// Why an accept was refused.
#[derive(Debug)]
pub enum AcceptError {
    /// No MCP upstream lists this tool (404).
    NotFound,
    /// The hash is not the one seen (409); the one seen, when there is one.
    NotSeen(Option<String>),
    Store(String),
}

/// The pins and sightings of every MCP upstream's tools.
pub struct Pins {
    store: Arc<dyn Store>,
    audit: AuditLog,
    rules: BTreeMap<String, Rules>,
    state: RwLock<State>,
}

/// Splits a routed tool name as the upstreams do: at the first dot; a name without one is both.
fn split(routed: &str) -> (&str, &str) {
    routed.split_once('.').unwrap_or((routed, routed))
}

fn routed(upstream: &str, tool: &str) -> String {
    format!("{upstream}.{tool}")
}

/// The definition of a listed tool (SPEC 18): its definition fields, absent (or null) ones left out.
/// `own_name` replaces the routed name the list carries.
pub fn definition_of(tool: &Map<String, Value>, own_name: &str) -> Value {
    let mut definition = Map::new();
    for field in DEFINITION_FIELDS {
        if let Some(value) = tool.get(field).filter(|v| !v.is_null()) {
            definition.insert(field.to_owned(), value.clone());
        }
    }
    definition.insert("name".to_owned(), Value::String(own_name.to_owned()));
    Value::Object(definition)
}

/// Whether `text` holds a character of Unicode general category Cf (zero-width characters, bidirectional
/// controls, the soft hyphen; the answer guard's table), or any of the tag block U+E0000–U+E007F, assigned
/// or not.
pub fn has_hidden_characters(text: &str) -> bool {
    text.chars()
        .any(|c| crate::guard::is_hidden(c) || ('\u{E0000}'..='\u{E007F}').contains(&c))
}

fn text_fields(definition: &Value) -> impl Iterator<Item = &str> {
    let at = |pointer: &str| definition.pointer(pointer).and_then(Value::as_str);
    [
        at("/name"),
        at("/title"),
        at("/description"),
        at("/annotations/title"),
    ]
    .into_iter()
    .flatten()
}

impl Pins {
    /// `configured`: every MCP upstream with its `tools:` settings; `pins`: what the store holds.
    pub fn new(
        store: Arc<dyn Store>,
        audit: AuditLog,
        configured: &BTreeMap<String, ToolsConfig>,
        pins: Vec<ToolPin>,
    ) -> Result<Pins, String> {
        let mut rules = BTreeMap::new();
        for (upstream, config) in configured {
            rules.insert(
                upstream.clone(),
                Rules {
                    mode: config.pin,
                    denylist: compile_denylist(upstream, &config.description_denylist)?,
                    observing: tokio::sync::Mutex::new(()),
                },
            );
        }
        let pins_of = Pins {
            store,
            audit,
            rules,
            state: RwLock::new(State::default()),
        };
        pins_of.apply(pins);
        Ok(pins_of)
    }

    /// Whether `upstream` is an MCP upstream whose tools are pinned.
    pub fn covers(&self, upstream: &str) -> bool {
        self.rules.contains_key(upstream)
    }

    /// Whether the tool's upstream is pinned but its tools have not been listed yet by this process: its
    /// caller lists them first, so that no call is judged without a definition.
    pub fn unobserved(&self, routed_tool: &str) -> bool {
        let (upstream, _) = split(routed_tool);
        self.covers(upstream)
            && !self
                .state
                .read()
                .is_ok_and(|state| state.observed.contains(upstream))
    }

    /// The check on every call: in memory, no store read.
    pub fn check(&self, routed_tool: &str) -> Result<(), Withheld> {
        let (upstream, tool) = split(routed_tool);
        let Some(rules) = self.rules.get(upstream) else {
            return Ok(());
        };
        let unseen = || Withheld {
            tool: routed_tool.to_owned(),
            pinned_sha256: None,
            seen_sha256: None,
            reason: Reason::New,
        };
        let Ok(state) = self.state.read() else {
            return Err(unseen());
        };
        let entry = state.tools.get(upstream).and_then(|tools| tools.get(tool));
        match entry {
            Some(entry) if entry.seen.is_some() => match entry.withheld(routed_tool) {
                Some(withheld) => Err(withheld),
                None => Ok(()),
            },
            // Not listed by its upstream: under `reviewed` nothing unreviewed is called; under
            // `first_use` the upstream answers for a tool it does not offer.
            _ if rules.mode == PinMode::Reviewed => Err(unseen()),
            _ => Ok(()),
        }
    }

    /// Takes in the store's pins (start-up, and a replica's poll). Pins are never removed, and of two pins
    /// of a tool the later one holds: a poll read just before this replica's own accept must not undo it.
    pub fn apply(&self, pins: Vec<ToolPin>) {
        let Ok(mut state) = self.state.write() else {
            return;
        };
        for pin in pins {
            let entry = state
                .tools
                .entry(pin.upstream.clone())
                .or_default()
                .entry(pin.tool.clone())
                .or_default();
            if entry
                .pin
                .as_ref()
                .is_none_or(|held| held.pinned_at_ms <= pin.pinned_at_ms)
            {
                entry.pin = Some(pin);
            }
        }
    }

    /// Takes in a tools/list (tools named as routed, `upstream.tool`) of which `listed` upstreams were
    /// listed whole, and returns it without the withheld tools. Pins first sightings under `first_use`
    /// and reports each withheld definition once (the store's sighting decides which replica writes the
    /// event).
    pub async fn screen(&self, tools: Vec<Value>, listed: &[String]) -> Vec<Value> {
        let mut by_upstream: BTreeMap<&str, Vec<(String, Value)>> = BTreeMap::new();
        for tool in &tools {
            let Some(object) = tool.as_object() else {
                continue;
            };
            let Some(name) = object.get("name").and_then(Value::as_str) else {
                continue;
            };
            let (upstream, own) = split(name);
            if self.covers(upstream) {
                let upstream = self.rules.get_key_value(upstream).map_or("", |(k, _)| k);
                by_upstream
                    .entry(upstream)
                    .or_default()
                    .push((own.to_owned(), definition_of(object, own)));
            }
        }
        for upstream in listed.iter().filter(|u| self.covers(u)) {
            let seen = by_upstream.remove(upstream.as_str()).unwrap_or_default();
            self.observe(upstream, seen).await;
        }
        tools
            .into_iter()
            .filter(|tool| {
                tool.get("name")
                    .and_then(Value::as_str)
                    .is_none_or(|name| self.check(name).is_ok())
            })
            .collect()
    }

    /// Records the definitions an upstream listed (its own tool names), whole. One list of an upstream
    /// is taken in at a time, so that a call judged after one waits for its first pins to be written.
    async fn observe(&self, upstream: &str, listed: Vec<(String, Value)>) {
        let Some(rules) = self.rules.get(upstream) else {
            return;
        };
        let _turn = rules.observing.lock().await;
        let mut to_pin = Vec::new();
        let mut to_report = Vec::new();
        {
            let Ok(mut state) = self.state.write() else {
                return;
            };
            let names: HashSet<&str> = listed.iter().map(|(name, _)| name.as_str()).collect();
            let State {
                tools: all,
                reported,
                ..
            } = &mut *state;
            let tools = all.entry(upstream.to_owned()).or_default();
            // A tool no longer listed is no longer seen; its pin stays.
            for (name, entry) in tools.iter_mut() {
                if !names.contains(name.as_str()) {
                    entry.seen = None;
                }
            }
            for (name, definition) in &listed {
                let sha256 = crate::envelope::jcs_sha256_hex(definition);
                let entry = tools.entry(name.clone()).or_default();
                if let Some(seen) = entry.seen.as_ref().filter(|s| s.sha256 == sha256) {
                    // Seen before: only what failed then is tried again (a first pin, a sighting).
                    if entry.pin.is_none() && seen.flag.is_none() && rules.mode == PinMode::FirstUse
                    {
                        to_pin.push((name.clone(), definition.clone(), sha256));
                    } else if entry.withheld(name).is_some()
                        && !reported.contains(&(upstream.to_owned(), name.clone(), sha256))
                    {
                        to_report.push(name.clone());
                    }
                    continue;
                }
                let flag = flag_of(definition, &rules.denylist);
                entry.seen = Some(Seen {
                    definition: definition.clone(),
                    sha256: sha256.clone(),
                    flag,
                });
                let pinned = entry.pin.as_ref().map(|p| p.definition_sha256.as_str());
                if pinned == Some(sha256.as_str()) {
                    continue;
                }
                if pinned.is_none() && flag.is_none() && rules.mode == PinMode::FirstUse {
                    to_pin.push((name.clone(), definition.clone(), sha256));
                } else {
                    to_report.push(name.clone());
                }
            }
        }
        for (name, definition, sha256) in to_pin {
            let pin = ToolPin {
                upstream: upstream.to_owned(),
                tool: name.clone(),
                definition_sha256: sha256.clone(),
                definition,
                pinned_at_ms: crate::clock::now_millis(),
                accepted_by: None,
            };
            match self.store.tool_pin_first(&pin).await {
                Ok(stored) => {
                    let differs = stored.definition_sha256 != sha256;
                    self.set_pin(stored);
                    if differs {
                        // Another replica pinned another definition first.
                        to_report.push(name);
                    } else {
                        tracing::info!(upstream, tool = %name, sha256, "tool definition pinned on first use");
                    }
                }
                // Withheld as new until a later list pins it.
                Err(e) => {
                    tracing::warn!(upstream, tool = %name, error = %e, "could not pin a tool definition; the tool is withheld")
                }
            }
        }
        for name in to_report {
            self.report(upstream, &name).await;
        }
        if let Ok(mut state) = self.state.write() {
            state.observed.insert(upstream.to_owned());
        }
    }

    fn set_pin(&self, pin: ToolPin) {
        if let Ok(mut state) = self.state.write() {
            let (upstream, tool) = (pin.upstream.clone(), pin.tool.clone());
            state
                .tools
                .entry(upstream)
                .or_default()
                .entry(tool)
                .or_default()
                .pin = Some(pin);
        }
    }

    /// Writes the one `ToolDefinitionChanged` event of a withheld definition, on the replica whose
    /// sighting was the first.
    async fn report(&self, upstream: &str, tool: &str) {
        let routed_name = routed(upstream, tool);
        let withheld = {
            let Ok(state) = self.state.read() else {
                return;
            };
            let Some(entry) = state.tools.get(upstream).and_then(|t| t.get(tool)) else {
                return;
            };
            let Some(withheld) = entry.withheld(&routed_name) else {
                return;
            };
            let key = (
                upstream.to_owned(),
                tool.to_owned(),
                withheld.seen_sha256.clone().unwrap_or_default(),
            );
            if state.reported.contains(&key) {
                return;
            }
            withheld
        };
        let seen_sha256 = withheld.seen_sha256.clone().unwrap_or_default();
        tracing::warn!(tool = %routed_name, reason = withheld.reason.as_str(), %seen_sha256, "tool withheld: its definition is not the pinned one");
        let first = match self
            .store
            .tool_sighting_first(upstream, tool, &seen_sha256, crate::clock::now_millis())
            .await
        {
            Ok(first) => first,
            Err(e) => {
                // Tried again at the next list.
                tracing::warn!(tool = %routed_name, error = %e, "could not record a withheld tool definition");
                return;
            }
        };
        if let Ok(mut state) = self.state.write() {
            state
                .reported
                .insert((upstream.to_owned(), tool.to_owned(), seen_sha256));
        }
        if first {
            let event = AuditEvent::new(EventType::ToolDefinitionChanged)
                .tool(&routed_name)
                .detail(event_detail(&withheld));
            if let Err(e) = self.audit.record(event).await {
                tracing::error!(tool = %routed_name, error = %e, "could not record ToolDefinitionChanged");
            }
        }
    }

    /// `POST /v1/tools/{tool}/accept`: pins the definition seen, when `sha256` is its hash.
    pub async fn accept(
        &self,
        routed_tool: &str,
        sha256: &str,
        actor: &Identity,
    ) -> Result<ToolStatus, AcceptError> {
        let (upstream, tool) = split(routed_tool);
        if !self.covers(upstream) {
            return Err(AcceptError::NotFound);
        }
        let seen = {
            let state = self
                .state
                .read()
                .map_err(|_| AcceptError::Store("poisoned".into()))?;
            let entry = state
                .tools
                .get(upstream)
                .and_then(|t| t.get(tool))
                .ok_or(AcceptError::NotFound)?;
            let seen = entry.seen.clone().ok_or(AcceptError::NotSeen(None))?;
            if seen.sha256 != sha256 {
                return Err(AcceptError::NotSeen(Some(seen.sha256)));
            }
            seen
        };
        let pin = ToolPin {
            upstream: upstream.to_owned(),
            tool: tool.to_owned(),
            definition_sha256: seen.sha256.clone(),
            definition: seen.definition,
            pinned_at_ms: crate::clock::now_millis(),
            accepted_by: Some(RecordedIdentity::from(actor)),
        };
        self.store
            .tool_pin_put(&pin)
            .await
            .map_err(|e| AcceptError::Store(e.to_string()))?;
        self.set_pin(pin);
        let event = AuditEvent::new(EventType::ToolDefinitionAccepted)
            .tool(routed_tool)
            .actor(actor, None)
            .detail(format!("definition_sha256={}", seen.sha256));
        self.audit
            .record(event)
            .await
            .map_err(|e| AcceptError::Store(e.to_string()))?;
        self.status_of(upstream, tool).ok_or(AcceptError::NotFound)
    }

    /// Every tool of every MCP upstream, seen or pinned, by routed name.
    pub fn statuses(&self) -> Vec<ToolStatus> {
        let Ok(state) = self.state.read() else {
            return Vec::new();
        };
        let mut all = Vec::new();
        for upstream in self.rules.keys() {
            let Some(tools) = state.tools.get(upstream) else {
                continue;
            };
            let mut names: Vec<&String> = tools.keys().collect();
            names.sort();
            for name in names {
                all.push(status(upstream, name, &tools[name]));
            }
        }
        all
    }

    fn status_of(&self, upstream: &str, tool: &str) -> Option<ToolStatus> {
        let state = self.state.read().ok()?;
        let entry = state.tools.get(upstream)?.get(tool)?;
        Some(status(upstream, tool, entry))
    }
}

fn flag_of(definition: &Value, denylist: &[Regex]) -> Option<Reason> {
    if text_fields(definition).any(has_hidden_characters) {
        return Some(Reason::HiddenCharacters);
    }
    let description = definition.get("description").and_then(Value::as_str)?;
    denylist
        .iter()
        .any(|pattern| pattern.is_match(description))
        .then_some(Reason::DenylistedText)
}

fn event_detail(withheld: &Withheld) -> String {
    format!(
        "reason={} pinned_sha256={} seen_sha256={}",
        withheld.reason.as_str(),
        withheld.pinned_sha256.as_deref().unwrap_or("none"),
        withheld.seen_sha256.as_deref().unwrap_or("none")
    )
}

/// One tool as `GET /v1/tools` shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ToolStatus {
    /// The tool as agents call it: `upstream.tool`.
    pub tool: String,
    pub upstream: String,
    /// `pinned` (the seen definition is the pinned one, or it is not listed now), `changed` (another
    /// definition is seen) or `new` (no pin).
    pub status: &'static str,
    /// Whether its calls are refused (2009) and it is left out of tools/list.
    pub withheld: bool,
    /// Why it is withheld: `changed`, `new`, `hidden_characters` or `denylisted_text`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pinned: Option<PinnedView>,
    /// The definition as the upstream lists it now; absent when it does not list the tool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seen: Option<DefinitionView>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct DefinitionView {
    pub definition_sha256: String,
    #[schema(value_type = Object)]
    pub definition: Value,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct PinnedView {
    pub definition_sha256: String,
    #[schema(value_type = Object)]
    pub definition: Value,
    /// RFC 3339.
    pub pinned_at: String,
    /// Who accepted it (`iss`, `sub`, `name`, `via`); absent when pinned on first use.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub accepted_by: Option<Value>,
}

fn status(upstream: &str, tool: &str, entry: &Entry) -> ToolStatus {
    let routed_name = routed(upstream, tool);
    let withheld = entry.withheld(&routed_name);
    ToolStatus {
        tool: routed_name,
        upstream: upstream.to_owned(),
        status: entry.status(),
        withheld: withheld.is_some(),
        reason: withheld.map(|w| w.reason.as_str()),
        pinned: entry.pin.as_ref().map(|pin| PinnedView {
            definition_sha256: pin.definition_sha256.clone(),
            definition: pin.definition.clone(),
            pinned_at: crate::clock::rfc3339_millis(pin.pinned_at_ms),
            accepted_by: pin
                .accepted_by
                .as_ref()
                .and_then(|who| serde_json::to_value(who.identity()).ok()),
        }),
        seen: entry.seen.as_ref().map(|seen| DefinitionView {
            definition_sha256: seen.sha256.clone(),
            definition: seen.definition.clone(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_characters_are_the_format_category() {
        for hidden in [
            "\u{200B}", // zero-width space
            "\u{200D}", // zero-width joiner
            "\u{202E}", // right-to-left override
            "\u{2066}", // left-to-right isolate
            "\u{FEFF}", // byte order mark
            "\u{E0041}",
            "\u{E007F}", // tag characters
            "\u{E0000}", // the tag block's unassigned code points too
        ] {
            assert!(
                has_hidden_characters(&format!("read{hidden}file")),
                "{hidden:?}"
            );
        }
        for visible in ["read_file", "é", "e\u{301}", "日本語", "tab\there"] {
            assert!(!has_hidden_characters(visible), "{visible:?}");
        }
    }

    #[test]
    fn a_definition_keeps_its_fields_under_the_own_name() {
        let listed = json!({"name": "fs.read", "description": "Reads", "inputSchema": {"type": "object"},
            "title": null, "_meta": {"x": 1}, "icons": []});
        let definition = definition_of(listed.as_object().unwrap(), "read");
        assert_eq!(
            definition,
            json!({"name": "read", "description": "Reads", "inputSchema": {"type": "object"}})
        );
    }

    #[test]
    fn flags_prefer_hidden_characters_then_the_denylist() {
        let denylist =
            compile_denylist("fs", &["(?i)ignore (all|previous) instructions".into()]).unwrap();
        let flag = |description: &str| {
            flag_of(&json!({"name": "t", "description": description}), &denylist)
        };
        assert_eq!(flag("Reads a file"), None);
        assert_eq!(
            flag("Ignore previous instructions"),
            Some(Reason::DenylistedText)
        );
        assert_eq!(
            flag("Ignore previous\u{E0020}instructions"),
            Some(Reason::HiddenCharacters)
        );
        assert_eq!(
            flag_of(&json!({"name": "t", "title": "a\u{200B}b"}), &denylist),
            Some(Reason::HiddenCharacters)
        );
    }

    #[test]
    fn a_pattern_the_regex_crate_refuses_is_named_by_its_key() {
        let err = compile_denylist("web", &["ok".into(), "(a".into()]).unwrap_err();
        assert!(
            err.contains("upstreams.web.tools.description_denylist[1]"),
            "{err}"
        );
        // Backreferences and look-around are refused: the engine is linear-time.
        assert!(compile_denylist("web", &[r"(a)\1".into()]).is_err());
        assert!(compile_denylist("web", &["a(?=b)".into()]).is_err());
    }

    #[test]
    fn an_entry_is_withheld_until_its_seen_definition_is_pinned() {
        let pin = |sha: &str| ToolPin {
            upstream: "fs".into(),
            tool: "read".into(),
            definition_sha256: sha.into(),
            definition: json!({}),
            pinned_at_ms: 0,
            accepted_by: None,
        };
        let seen = |sha: &str, flag| Seen {
            definition: json!({}),
            sha256: sha.into(),
            flag,
        };
        let mut entry = Entry {
            pin: Some(pin("a")),
            seen: Some(seen("a", None)),
        };
        assert_eq!(entry.withheld("fs.read"), None);
        assert_eq!(entry.status(), "pinned");
        entry.seen = Some(seen("b", None));
        let withheld = entry.withheld("fs.read").unwrap();
        assert_eq!(withheld.reason, Reason::Changed);
        assert_eq!(
            withheld.details(),
            json!({"tool": "fs.read", "pinned_sha256": "a", "seen_sha256": "b", "reason": "changed"})
        );
        assert_eq!(entry.status(), "changed");
        // An accepted definition with hidden characters is pinned, and so no longer withheld.
        entry.seen = Some(seen("a", Some(Reason::HiddenCharacters)));
        assert_eq!(entry.withheld("fs.read"), None);
        entry.pin = None;
        assert_eq!(
            entry.withheld("fs.read").unwrap().reason,
            Reason::HiddenCharacters
        );
        entry.seen = Some(seen("a", None));
        assert_eq!(entry.withheld("fs.read").unwrap().reason, Reason::New);
        assert_eq!(entry.status(), "new");
    }
}
