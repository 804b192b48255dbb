//! `mcp` tools: tools served by MCP servers over stdio, through the
//! official Rust SDK (`rmcp`).
//!
//! A plugin names its server in `plugin.yaml`:
//!
//! ```yaml
//! name: everything
//! mcp:
//!   command: ["node", "node_modules/@modelcontextprotocol/server-everything/dist/index.js"]
//!   env: { SOME_KEY: value }   # the server's whole environment, besides PATH
//!   timeout: 10000             # per call, ms (default: the runner's)
//!   prefix: "everything."      # tool id prefix (default: none)
//!   only: [echo, add]          # a subset of the server's tools (default: all)
//! ```
//!
//! A plugins directory may also hold an `mcp.json` in the common
//! `mcpServers` form ([`McpPool::add_config_file`]).
//!
//! [`McpPool::start`] starts each such server (its own process group, in
//! the plugin's folder, empty environment plus `PATH` and `env`), lists
//! its tools and adds them to the catalog as `{"type": "mcp", "server",
//! "name"}` tools with their description and input schema, so they appear
//! in every manual and are checked like any tool. A server that crashes
//! mid-call fails the call; one that never answers fails it at the time
//! limit; dropping the pool kills every server's process group.

use super::group::GroupGuard;
use super::{RunnerOptions, StepRun};
use crate::calls::{CatalogError, ToolCatalog, ToolDef};
use crate::tools::observe::{self, Outcome};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::TokioChildProcess;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// Why MCP servers could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// A manifest's `mcp:` section is invalid.
    #[error("plugin {plugin}: mcp section: {message}")]
    Config {
        /// The plugin.
        plugin: String,
        /// What is wrong.
        message: String,
    },
    /// The server could not be started or did not complete the MCP
    /// handshake and tool listing in time.
    #[error("plugin {plugin}: MCP server {command:?} did not start: {message}")]
    Start {
        /// The plugin.
        plugin: String,
        /// Its command.
        command: Vec<String>,
        /// Why.
        message: String,
    },
    /// A listed tool could not be added to the catalog.
    #[error("plugin {plugin}: {cause}")]
    Catalog {
        /// The plugin.
        plugin: String,
        /// The catalog's error.
        cause: CatalogError,
    },
}

/// The `mcp:` section of a `plugin.yaml`.
#[derive(Debug, Clone, Deserialize)]
struct McpSection {
    command: CommandSpec,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    timeout: Option<u64>,
    #[serde(default)]
    prefix: Option<String>,
    #[serde(default)]
    only: Option<Vec<String>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum CommandSpec {
    Line(String),
    Argv(Vec<String>),
}

#[derive(Debug, Deserialize)]
struct ManifestMcp {
    name: String,
    #[serde(default)]
    mcp: Option<McpSection>,
}

/// One running MCP server.
struct Server {
    plugin: String,
    client: RunningService<RoleClient, ()>,
    timeout: Option<Duration>,
    pid: Option<u32>,
    _guard: GroupGuard,
}

/// The MCP servers of a plugins directory, started and connected.
#[derive(Default)]
pub struct McpPool {
    servers: Vec<Server>,
}

impl std::fmt::Debug for McpPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.servers.iter().map(|s| &s.plugin)).finish()
    }
}

/// Time allowed for a server to start, shake hands and list its tools.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

impl McpPool {
    /// Starts the MCP server of every plugin in `catalog` whose manifest has
    /// an `mcp:` section and adds its tools to `catalog`.
    ///
    /// # Errors
    ///
    /// The first [`McpError`]: an invalid section, a server that does not
    /// start or list its tools within [`START_TIMEOUT`], a tool id taken.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future kills the servers started so far.
    pub async fn start(catalog: &mut ToolCatalog, options: &RunnerOptions) -> Result<McpPool, McpError> {
        let plugins: Vec<(String, PathBuf)> =
            catalog.plugins().iter().map(|p| (p.manifest.name.clone(), p.dir.clone())).collect();
        let mut pool = McpPool::default();
        for (name, dir) in plugins {
            let manifest = ["plugin.yaml", "plugin.yml"].iter().map(|n| dir.join(n)).find(|p| p.is_file());
            let Some(manifest) = manifest else { continue };
            let bad = |message: String| McpError::Config { plugin: name.clone(), message };
            let text = std::fs::read_to_string(&manifest).map_err(|e| bad(e.to_string()))?;
            let m: ManifestMcp = serde_saphyr::from_str(&text).map_err(|e| bad(e.to_string()))?;
            let Some(section) = m.mcp else { continue };
            pool.start_one(catalog, &m.name, &dir, section, options).await?;
        }
        Ok(pool)
    }

    /// Starts the servers of an MCP client config file in the common
    /// `mcpServers` form (`{"mcpServers": {"time": {"command": "uvx",
    /// "args": ["mcp-server-time"], "env": {...}}}}`; spindle also reads
    /// `timeout`, `prefix` and `only` there) and adds their tools to
    /// `catalog`. Each server runs in the file's folder; its name stands
    /// for the plugin in errors and tool definitions.
    ///
    /// # Errors
    ///
    /// As [`McpPool::start`], and a file that is not such a JSON object.
    ///
    /// # Cancel safety
    ///
    /// As [`McpPool::start`].
    pub async fn add_config_file(
        &mut self,
        catalog: &mut ToolCatalog,
        path: &Path,
        options: &RunnerOptions,
    ) -> Result<(), McpError> {
        #[derive(Deserialize)]
        struct File {
            #[serde(rename = "mcpServers")]
            servers: std::collections::BTreeMap<String, McpSection>,
        }
        let bad = |message: String| McpError::Config { plugin: path.display().to_string(), message };
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let file: File = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let dir = path.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf);
        for (name, section) in file.servers {
            self.start_one(catalog, &name, &dir, section, options).await?;
        }
        Ok(())
    }

    async fn start_one(
        &mut self,
        catalog: &mut ToolCatalog,
        plugin: &str,
        dir: &Path,
        section: McpSection,
        options: &RunnerOptions,
    ) -> Result<(), McpError> {
        let argv = match &section.command {
            CommandSpec::Line(s) => shell_words::split(s)
                .map_err(|e| McpError::Config { plugin: plugin.into(), message: format!("command: {e}") })?,
            CommandSpec::Argv(v) => v.clone(),
        };
        let argv: Vec<String> = argv.into_iter().chain(section.args.iter().cloned()).collect();
        let Some(program) = argv.first() else {
            return Err(McpError::Config { plugin: plugin.into(), message: "command is empty".into() });
        };
        let start_err = |message: String| McpError::Start { plugin: plugin.into(), command: argv.clone(), message };
        let program = super::plugin_program(dir, program);
        let mark = super::group::new_mark();
        let mut cmd = super::tool_command(program, dir, options, &mark);
        cmd.args(&argv[1..]).envs(&section.env);
        let (transport, _stderr) =
            TokioChildProcess::builder(cmd).stderr(Stdio::null()).spawn().map_err(|e| start_err(e.to_string()))?;
        let pid = transport.id();
        let guard = GroupGuard::new(pid, Some(&mark));
        let client = tokio::time::timeout(START_TIMEOUT, ().serve(transport))
            .await
            .map_err(|_| start_err("no MCP handshake in time".into()))?
            .map_err(|e| start_err(e.to_string()))?;
        let tools = tokio::time::timeout(START_TIMEOUT, client.list_all_tools())
            .await
            .map_err(|_| start_err("tools/list got no answer in time".into()))?
            .map_err(|e| start_err(e.to_string()))?;
        let prefix = section.prefix.clone().unwrap_or_default();
        for tool in tools {
            let name = tool.name.to_string();
            if section.only.as_ref().is_some_and(|only| !only.contains(&name)) {
                continue;
            }
            let schema = Value::Object(tool.input_schema.as_ref().clone());
            let mut def = ToolDef::new(format!("{prefix}{name}"), schema);
            def.description = tool.description.as_ref().map(|d| d.to_string());
            def.display_name = tool.title.clone();
            def.implementation = Some(json!({"type": "mcp", "server": plugin, "name": name}));
            def.plugin = Some(plugin.to_string());
            catalog.add(def).map_err(|cause| McpError::Catalog { plugin: plugin.into(), cause })?;
        }
        self.servers.push(Server {
            plugin: plugin.to_string(),
            client,
            timeout: section.timeout.map(Duration::from_millis),
            pid,
            _guard: guard,
        });
        Ok(())
    }

    /// The plugins whose servers run.
    pub fn servers(&self) -> Vec<&str> {
        self.servers.iter().map(|s| s.plugin.as_str()).collect()
    }

    /// Process ids of the servers (each leads its process group).
    pub fn pids(&self) -> Vec<u32> {
        self.servers.iter().filter_map(|s| s.pid).collect()
    }

    /// Calls an `mcp` tool.
    pub(crate) async fn call(&self, def: &ToolDef, params: &Map<String, Value>, options: &RunnerOptions) -> StepRun {
        let id = def.id.as_str();
        let imp = def.implementation.as_ref();
        let server = imp.and_then(|i| i.get("server")).and_then(Value::as_str).unwrap_or_default();
        let name = imp.and_then(|i| i.get("name")).and_then(Value::as_str).unwrap_or(id).to_string();
        let Some(s) = self.servers.iter().find(|s| s.plugin == server) else {
            let detail = format!("no running MCP server {server:?}");
            return StepRun::fail(Outcome::Failed, observe::failure(id, "no MCP server", &detail), Value::Null, 0);
        };
        let timeout = s.timeout.unwrap_or(options.default_timeout);
        let request = CallToolRequestParams::new(name).with_arguments(params.clone());
        let answer = match tokio::time::timeout(timeout, s.client.call_tool(request)).await {
            Err(_) => {
                let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
                return StepRun::fail(Outcome::Timeout, observe::timeout(id, ms), Value::Null, 0);
            }
            Ok(Err(e)) => {
                let detail = format!("MCP server {server:?}: {e}");
                return StepRun::fail(Outcome::Failed, observe::failure(id, "MCP error", &detail), Value::Null, 0);
            }
            Ok(Ok(r)) => r,
        };
        let value = serde_json::to_value(&answer).unwrap_or(Value::Null);
        let text: Vec<String> = value
            .get("content")
            .and_then(Value::as_array)
            .map(|parts| {
                parts
                    .iter()
                    .map(|p| match p.get("text").and_then(Value::as_str) {
                        Some(t) => t.to_string(),
                        None => format!("[{} content]", p.get("type").and_then(Value::as_str).unwrap_or("other")),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let text = text.join("\n");
        let bytes = text.len() as u64;
        let result = match value.get("structuredContent") {
            Some(v) if !v.is_null() => v.clone(),
            _ => serde_json::from_str::<Value>(text.trim()).unwrap_or(Value::String(text.clone())),
        };
        let cap = options.max_output;
        if bytes > cap as u64 {
            let first = observe::excerpt(&text, options.max_observation.min(cap));
            let mut run =
                StepRun::fail(Outcome::OutputCapped, observe::output_capped(id, cap, &first), Value::Null, bytes);
            run.truncated = true;
            return run;
        }
        if answer.is_error == Some(true) {
            let excerpt = observe::excerpt(&text, options.max_stderr_excerpt);
            return StepRun::fail(Outcome::Failed, observe::failure(id, "tool error", &excerpt), result, bytes);
        }
        StepRun::ok(observe::success(id, &result, options.max_observation), result, bytes)
    }
}
