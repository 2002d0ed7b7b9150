//! `net.fetch`: an HTTP(S) request the host makes on the guest's behalf, under a
//! [`NetPolicy`] and with [`Secrets`] put in for the hosts they are bound to.
//!
//! Built on reqwest (rustls with the ring provider and the Mozilla roots of `webpki-roots`),
//! configured so that the policy cannot be stepped around:
//!
//! - every address a name resolves to passes [`NetPolicy::check_address`] in the client's
//!   own resolver, so the address checked is the address connected to (no DNS rebinding
//!   between a check and a connect);
//! - no proxy from the environment (a proxy would resolve the name itself);
//! - redirects are followed here, not by the client, each new URL checked as the first was;
//!   on a redirect to another origin, credentials (`Authorization`, `Cookie`, and any header
//!   that held a secret's placeholder) are dropped, as browsers drop them;
//! - the request's size, the response's size and headers, the number of redirects and the
//!   time are capped ([`FetchLimits`]).
//!
//! What comes back to the guest, and what is logged, has every secret's value turned back
//! into its placeholder ([`Secrets::redact`]). Redaction finds the value as it is, so a host
//! a secret is bound to must answer in a form it can read: such a request goes with
//! `Accept-Encoding: identity` and without `Range` or `If-Range` (whatever the code asked),
//! and an encoded (`Content-Encoding`) or partial (206) answer from it fails the call. A
//! redirect's `Location` is redacted before it is followed, so a value the host put in it
//! reaches only a host the secret is bound to; one in a form redaction cannot undo fails the
//! call. What is not promised: a bound host that transforms the value (base64, splitting it
//! across headers) gets it past redaction; bind a secret only to a host trusted with it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::{HostPattern, NetError, NetPolicy, PLACEHOLDER_PREFIX, Secrets, Target};
use crate::{Args, Tool, ToolError, ToolFuture};

/// The caps of one `net.fetch` call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchLimits {
    /// The most bytes of a request body (default 1 MiB).
    pub max_request_bytes: usize,
    /// The most bytes of a response body (default 8 MiB); a larger one fails the call.
    pub max_response_bytes: usize,
    /// The most bytes of a request's headers, and of a response's, names and values
    /// (default 64 KiB).
    pub max_header_bytes: usize,
    /// The most redirects followed (default 5).
    pub max_redirects: u32,
    /// The whole call's time, redirects included (default 30 s).
    pub timeout: Duration,
}

impl Default for FetchLimits {
    fn default() -> Self {
        FetchLimits {
            max_request_bytes: 1 << 20,
            max_response_bytes: 8 << 20,
            max_header_bytes: 64 << 10,
            max_redirects: 5,
            timeout: Duration::from_secs(30),
        }
    }
}

/// The most headers a request may carry. The `http` crate's header map panics past about
/// 24,000 entries; a request needs a handful.
const MAX_REQUEST_HEADERS: usize = 100;

/// The methods a request may use.
const METHODS: &[&str] = &["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

/// Headers the client sets from the request itself; one from the guest could make a request
/// mean something other than what was checked (`Host`) or break its framing.
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
    "proxy-authorization",
    "proxy-connection",
];

/// Headers not sent to a host a secret is bound to: its answer must be whole and plain for
/// redaction to find the value (`Accept-Encoding` is set to `identity` instead).
const UNREDACTABLE_REQUEST_HEADERS: &[&str] = &["accept-encoding", "range", "if-range"];

/// Headers dropped on a redirect to another host.
const CREDENTIAL_HEADERS: &[&str] = &["authorization", "cookie"];

/// The `net.fetch` tool.
#[derive(Clone)]
pub struct FetchTool {
    inner: Arc<Inner>,
}

struct Inner {
    policy: NetPolicy,
    secrets: Secrets,
    limits: FetchLimits,
    client: reqwest::Client,
    parameters: Value,
    description: String,
}

impl std::fmt::Debug for FetchTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FetchTool")
            .field("policy", &self.inner.policy)
            .field("secrets", &self.inner.secrets)
            .field("limits", &self.inner.limits)
            .finish_non_exhaustive()
    }
}

/// The TLS provider every rustls client of this process uses unless it is given one: ring,
/// as [`FetchTool`] uses. Installed only when none is (a host's own choice stays).
///
/// The `net.fetch` client brings reqwest's `rustls-no-provider` feature into the build, and
/// features are unified: every other reqwest client in the process (the MCP client of a
/// `url` upstream, a host's own) then panics on creation unless a process default exists.
/// A program that embeds the tools calls this once at start, as the `pycage` CLI does.
pub fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        #[allow(deprecated, reason = "ring, as `FetchTool::new` explains")]
        let provider = rustls::crypto::ring::default_provider();
        // Another thread may have installed one meanwhile; either way one is installed.
        let _ = provider.install_default();
    }
}

impl FetchTool {
    /// The tool, for the hosts of `policy`, with `secrets`.
    ///
    /// # Errors
    ///
    /// A message when the HTTP client cannot be set up (its TLS configuration).
    pub fn new(
        policy: NetPolicy,
        secrets: Secrets,
        limits: FetchLimits,
    ) -> Result<FetchTool, String> {
        // ring, not rustls's default aws-lc-rs: aws-lc needs cmake and its own C build on every
        // target (the static musl build, the zig cross-checks). rustls 0.23.48 deprecates
        // ring's provider for want of post-quantum key exchange; to weigh again.
        #[allow(deprecated, reason = "see above: ring builds everywhere pycage builds")]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let client = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .dns_resolver(Arc::new(CheckedResolver {
                policy: policy.clone(),
            }))
            .tls_backend_preconfigured(tls)
            .connect_timeout(limits.timeout)
            .build()
            .map_err(|e| format!("the HTTP client: {e}"))?;
        Ok(FetchTool {
            inner: Arc::new(Inner {
                parameters: parameters(&policy),
                description: description(&policy, &secrets),
                policy,
                secrets,
                limits,
                client,
            }),
        })
    }

    /// The policy the tool applies.
    pub fn policy(&self) -> &NetPolicy {
        &self.inner.policy
    }

    /// This tool for one run that may reach only `hosts`, each one of this tool's own
    /// patterns (a run narrows the runner's allowlist; it cannot widen it). The secrets,
    /// limits and the HTTP client (whose resolver checks addresses only) are shared.
    ///
    /// # Errors
    ///
    /// A message naming a pattern this tool does not allow.
    pub fn narrowed(&self, hosts: &[HostPattern]) -> Result<FetchTool, String> {
        let policy = &self.inner.policy;
        if let Some(wider) = hosts.iter().find(|h| !policy.hosts().contains(h)) {
            let allowed: Vec<String> = policy.hosts().iter().map(ToString::to_string).collect();
            return Err(format!(
                "`{wider}` is not one of the allowed hosts ({})",
                allowed.join(", ")
            ));
        }
        let policy = policy.narrowed_to(hosts);
        Ok(FetchTool {
            inner: Arc::new(Inner {
                parameters: parameters(&policy),
                description: description(&policy, &self.inner.secrets),
                policy,
                secrets: self.inner.secrets.clone(),
                limits: self.inner.limits.clone(),
                client: self.inner.client.clone(),
            }),
        })
    }
}

/// The one line a model reads: what the tool does, the hosts it reaches and the secrets'
/// placeholders (never their values).
fn description(policy: &NetPolicy, secrets: &Secrets) -> String {
    let hosts: Vec<String> = policy.hosts().iter().map(ToString::to_string).collect();
    let mut text = format!(
        "Makes an HTTP(S) request and returns status, headers, body (text, or body_base64) and \
         the final URL. Allowed hosts: {}; every other host is refused, redirects included.",
        hosts.join(", ")
    );
    for secret in secrets.iter() {
        let bound: Vec<String> = secret.hosts().iter().map(ToString::to_string).collect();
        text.push_str(&format!(
            " Write {} where the secret {} goes (a header or the URL); the host puts its value \
             in for {} only.",
            secret.placeholder(),
            secret.name(),
            bound.join(", ")
        ));
    }
    text
}

fn parameters(policy: &NetPolicy) -> Value {
    let hosts: Vec<String> = policy.hosts().iter().map(ToString::to_string).collect();
    json!({
        "type": "object",
        "properties": {
            "url": {
                "type": "string",
                "description": format!("http or https URL of an allowed host: {}", hosts.join(", ")),
            },
            "method": {"type": "string", "enum": METHODS, "default": "GET"},
            "headers": {"type": "object", "additionalProperties": {"type": "string"}},
            "body": {"type": "string", "description": "the request body, as text"},
            "body_base64": {"type": "string", "description": "the request body, as base64"},
        },
        "required": ["url"],
        "additionalProperties": false,
    })
}

impl Tool for FetchTool {
    fn name(&self) -> &str {
        "fetch"
    }

    fn namespace(&self) -> &str {
        "net"
    }

    fn description(&self) -> &str {
        &self.inner.description
    }

    fn parameters(&self) -> &Value {
        &self.inner.parameters
    }

    fn timeout(&self) -> Option<Duration> {
        Some(self.inner.limits.timeout)
    }

    fn call(&self, args: Args) -> ToolFuture<'_> {
        Box::pin(async move {
            let request = Request::from_args(&args, &self.inner.limits)?;
            match tokio::time::timeout(self.inner.limits.timeout, self.inner.fetch(request)).await {
                Ok(result) => result,
                Err(_) => Err(ToolError::Failed(format!(
                    "the request took longer than {:?}",
                    self.inner.limits.timeout
                ))),
            }
        })
    }
}

/// A request as the guest asked for it (placeholders not yet replaced).
#[derive(Debug)]
struct Request {
    url: String,
    method: Method,
    headers: Vec<(HeaderName, String)>,
    body: Option<Vec<u8>>,
}

impl Request {
    fn from_args(args: &Args, limits: &FetchLimits) -> Result<Request, ToolError> {
        let bad = |m: String| ToolError::InvalidArguments(m);
        for key in args.keys() {
            if !["url", "method", "headers", "body", "body_base64"].contains(&key.as_str()) {
                return Err(bad(format!("unknown argument `{key}`")));
            }
        }
        let url = match args.get("url") {
            Some(Value::String(url)) => url.clone(),
            _ => return Err(bad("`url` must be a string".into())),
        };
        let method = match args.get("method") {
            None => Method::GET,
            Some(Value::String(m)) if METHODS.contains(&m.to_ascii_uppercase().as_str()) => {
                Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                    .map_err(|_| bad(format!("method {m:?}")))?
            }
            Some(other) => {
                return Err(bad(format!(
                    "`method` must be one of {}, not {other}",
                    METHODS.join(", ")
                )));
            }
        };
        let mut headers = Vec::new();
        match args.get("headers") {
            None => {}
            Some(Value::Object(map)) => {
                if map.len() > MAX_REQUEST_HEADERS {
                    return Err(bad(format!(
                        "{} headers; a request may carry at most {MAX_REQUEST_HEADERS}",
                        map.len()
                    )));
                }
                let size: usize = map
                    .iter()
                    .map(|(k, v)| k.len() + v.as_str().map_or(0, str::len))
                    .sum();
                if size > limits.max_header_bytes {
                    return Err(bad(format!(
                        "the headers are {size} bytes; the limit is {}",
                        limits.max_header_bytes
                    )));
                }
                for (name, value) in map {
                    let header = HeaderName::from_bytes(name.as_bytes())
                        .map_err(|_| bad(format!("header name {name:?} is not a token")))?;
                    if RESERVED_HEADERS.contains(&header.as_str()) {
                        return Err(bad(format!(
                            "header `{header}` is set from the request itself"
                        )));
                    }
                    let Value::String(value) = value else {
                        return Err(bad(format!("header `{header}` must be a string")));
                    };
                    // Checked here as well as after secrets are put in, so that CR, LF and
                    // NUL (header injection) are refused whatever the host.
                    HeaderValue::from_str(value).map_err(|_| {
                        bad(format!(
                            "header `{header}` holds characters a header cannot (CR, LF, NUL, \
                             or other control characters)"
                        ))
                    })?;
                    headers.push((header, value.clone()));
                }
            }
            Some(_) => return Err(bad("`headers` must be an object of strings".into())),
        }
        let body = match (args.get("body"), args.get("body_base64")) {
            (None, None) => None,
            (Some(Value::String(text)), None) => Some(text.clone().into_bytes()),
            (None, Some(Value::String(b64))) => Some(
                base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .map_err(|e| bad(format!("`body_base64`: {e}")))?,
            ),
            (Some(_), Some(_)) => {
                return Err(bad("give `body` or `body_base64`, not both".into()));
            }
            _ => return Err(bad("`body` and `body_base64` must be strings".into())),
        };
        if let Some(body) = &body
            && body.len() > limits.max_request_bytes
        {
            return Err(bad(format!(
                "the body is {} bytes; the most is {}",
                body.len(),
                limits.max_request_bytes
            )));
        }
        Ok(Request {
            url,
            method,
            headers,
            body,
        })
    }
}

impl Inner {
    async fn fetch(&self, request: Request) -> Result<Value, ToolError> {
        let Request {
            mut url,
            mut method,
            mut headers,
            mut body,
        } = request;
        let mut hops = 0;
        let mut previous: Option<Target> = None;
        loop {
            let (_, target) = self.policy.check_url(&url).map_err(refused)?;
            // Another origin (host, port or scheme: an https-to-http redirect on the same
            // host counts) gets no credentials.
            if previous.as_ref().is_some_and(|p| *p != target) {
                headers.retain(|(name, value)| {
                    !CREDENTIAL_HEADERS.contains(&name.as_str())
                        && !value.contains(PLACEHOLDER_PREFIX)
                });
            }
            let real_url = self.secrets.substitute(&url, &target).map_err(refused)?;
            let (real_url, real_target) = self.policy.check_url(&real_url).map_err(refused)?;
            if real_target != target {
                return Err(ToolError::Failed(
                    "a secret's value changes where the URL points".into(),
                ));
            }
            // A host a secret is bound to answers in a form redaction can read.
            let guarded = self.secrets.bound_to(&target);
            let mut map = HeaderMap::new();
            if guarded {
                map.insert(
                    reqwest::header::ACCEPT_ENCODING,
                    HeaderValue::from_static("identity"),
                );
            }
            for (name, value) in &headers {
                if guarded && UNREDACTABLE_REQUEST_HEADERS.contains(&name.as_str()) {
                    continue;
                }
                let value = self.secrets.substitute(value, &target).map_err(refused)?;
                let value = HeaderValue::from_str(&value).map_err(|_| {
                    ToolError::Failed(format!(
                        "header `{name}`: a secret's value is not a header value"
                    ))
                })?;
                map.append(name.clone(), value);
            }
            let mut builder = self.client.request(method.clone(), real_url).headers(map);
            if let Some(body) = &body {
                builder = builder.body(body.clone());
            }
            let response = builder.send().await.map_err(|e| self.failed(&e))?;
            let status = response.status();
            let location = response
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            if let (true, Some(location)) = (status.is_redirection(), location) {
                hops += 1;
                if hops > self.limits.max_redirects {
                    return Err(ToolError::Failed(format!(
                        "more than {} redirects",
                        self.limits.max_redirects
                    )));
                }
                // A value the host put in the Location goes on as its placeholder: the next
                // hop puts it back only for a host the secret is bound to.
                let location = self.secrets.redact(&location);
                let next = reqwest::Url::parse(&url)
                    .and_then(|base| base.join(&location))
                    .map_err(|e| ToolError::Failed(format!("a redirect to a bad URL: {e}")))?;
                if self.secrets.revealed_in(next.as_str()) {
                    return Err(ToolError::Failed(
                        "a redirect's URL holds a secret's value in a form that cannot be \
                         redacted; it was not followed"
                            .into(),
                    ));
                }
                if status == StatusCode::SEE_OTHER
                    || (matches!(status, StatusCode::MOVED_PERMANENTLY | StatusCode::FOUND)
                        && method == Method::POST)
                {
                    if method != Method::HEAD {
                        method = Method::GET;
                    }
                    body = None;
                }
                previous = Some(target);
                url = next.to_string();
                continue;
            }
            let read = self.read(response, &url, guarded).await;
            tracing::info!(
                target: "pycage::audit",
                tool = "net.fetch",
                method = %method,
                host = %target,
                status = status.as_u16(),
                redirects = hops,
                bytes = read.as_ref().map_or(0, |(_, n)| *n),
                ok = read.is_ok(),
                "network request"
            );
            return read.map(|(value, _)| value);
        }
    }

    /// The response as the guest gets it (headers and body capped, secrets redacted), and the
    /// body's size.
    async fn read(
        &self,
        mut response: reqwest::Response,
        url: &str,
        guarded: bool,
    ) -> Result<(Value, usize), ToolError> {
        let max = self.limits.max_response_bytes;
        if guarded {
            let encoding = response
                .headers()
                .get(reqwest::header::CONTENT_ENCODING)
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|e| !e.is_empty() && !e.eq_ignore_ascii_case("identity"));
            if let Some(encoding) = encoding {
                return Err(ToolError::Failed(format!(
                    "the answer of a host a secret is bound to came encoded ({}); it must \
                     come plain so the secret can be redacted from it",
                    self.secrets.redact(encoding)
                )));
            }
            if response.status() == StatusCode::PARTIAL_CONTENT {
                return Err(ToolError::Failed(
                    "the answer of a host a secret is bound to came partial (206); it must \
                     come whole so the secret can be redacted from it"
                        .into(),
                ));
            }
        }
        if response.content_length().is_some_and(|n| n > max as u64) {
            return Err(too_large(max));
        }
        let mut header_bytes = 0;
        let mut headers: BTreeMap<String, String> = BTreeMap::new();
        for (name, value) in response.headers() {
            header_bytes += name.as_str().len() + value.len();
            if header_bytes > self.limits.max_header_bytes {
                return Err(ToolError::Failed(format!(
                    "the response's headers are over {} bytes",
                    self.limits.max_header_bytes
                )));
            }
            let value = self
                .secrets
                .redact(&String::from_utf8_lossy(value.as_bytes()));
            headers
                .entry(name.as_str().to_owned())
                .and_modify(|v| {
                    v.push_str(", ");
                    v.push_str(&value);
                })
                .or_insert(value);
        }
        let status = response.status().as_u16();
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| self.failed(&e))? {
            if body.len() + chunk.len() > max {
                return Err(too_large(max));
            }
            body.extend_from_slice(&chunk);
        }
        let size = body.len();
        let mut out = json!({
            "status": status,
            "url": self.secrets.redact(url),
            "headers": headers,
        });
        match String::from_utf8(body) {
            Ok(text) => out["body"] = Value::String(self.secrets.redact(&text)),
            Err(e) => {
                let bytes = self.secrets.redact_bytes(e.into_bytes());
                out["body_base64"] =
                    Value::String(base64::engine::general_purpose::STANDARD.encode(bytes));
            }
        }
        Ok((out, size))
    }

    /// A failed request, said without host details: the policy's refusal when the resolver
    /// gave one, else the kind of failure.
    fn failed(&self, error: &reqwest::Error) -> ToolError {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
        while let Some(e) = source {
            if let Some(refusal) = e.downcast_ref::<NetError>() {
                return refused(refusal.clone());
            }
            source = e.source();
        }
        let what = if error.is_timeout() {
            "the request timed out"
        } else if error.is_connect() {
            "could not connect"
        } else if error.is_body() || error.is_decode() {
            "the response could not be read"
        } else {
            "the request failed"
        };
        ToolError::Failed(self.secrets.redact(&format!("{what}: {error}")))
    }
}

/// A refusal by the network policy: the kind `denied`, as the broker's own refusals.
fn refused(e: NetError) -> ToolError {
    ToolError::Denied(e.to_string())
}

fn too_large(max: usize) -> ToolError {
    ToolError::Failed(format!("the response body is over {max} bytes"))
}

/// The client's resolver: the system's, with every address checked against the policy.
struct CheckedResolver {
    policy: NetPolicy,
}

impl reqwest::dns::Resolve for CheckedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.policy.clone();
        Box::pin(async move {
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((name.as_str(), 0)).await?.collect();
            let mut refused = None;
            let allowed: Vec<SocketAddr> = found
                .into_iter()
                .filter(|addr| match policy.check_address(addr.ip()) {
                    Ok(()) => true,
                    Err(e) => {
                        refused.get_or_insert(e);
                        false
                    }
                })
                .collect();
            match (allowed.is_empty(), refused) {
                (true, Some(e)) => Err(Box::new(e) as Box<dyn std::error::Error + Send + Sync>),
                _ => Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs),
            }
        })
    }
}

#[cfg(test)]
#[path = "fetch_tests.rs"]
mod tests;
