//! Which `Host` and `Origin` a request to `pycage serve` may carry: the guard against DNS
//! rebinding and cross-site requests from a browser on the same machine.
//!
//! * `Host` must be `localhost`, an IP address (any, with any port), or one of
//!   [`HttpConfig::allowed_hosts`](crate::HttpConfig::allowed_hosts) (`name` for any port,
//!   `name:port` for one). A rebinding page reaches the server under a name it controls, and
//!   that name is what its browser sends; an address in `Host` means the browser connected to
//!   that address as the page's own origin, so it is no rebinding (and it is what the
//!   Kubernetes kubelet and a Prometheus scraper send). A request without a `Host` is refused.
//! * A browser's `Origin`, when there is one, must be a loopback one (`http` or `https`,
//!   `localhost`, `127.0.0.1` or `[::1]`, any port) or one of
//!   [`HttpConfig::allowed_origins`](crate::HttpConfig::allowed_origins)
//!   (`https://app.example` for the scheme's default port, `:8443` for one, `:*` for any). A
//!   request without an `Origin` is not a browser's cross-site request and passes; `Origin:
//!   null` (a sandboxed frame, a `file:` page) is refused unless `"null"` is listed.
//!
//! The entries are parsed once, when the configuration is checked; a malformed one is a
//! configuration error, never a silently ignored line.
//!
//! Both servers' listeners put the same two layers in front of their routes: [`guard`]
//! (this door, before anything reads the request) and [`require_token`] (the bearer token,
//! compared in constant time); each renders its refusal in its server's own error shape.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::Response;
use subtle::ConstantTimeEq as _;

use crate::HttpConfig;
use crate::listener::BodyRefusal;

/// How a server renders a refusal: its status, error kind and message in its own shape.
pub(crate) type Refuse = fn(BodyRefusal) -> Response;

/// The door of a server and how it renders a refusal, for [`guard`].
#[derive(Debug, Clone)]
pub(crate) struct Guard {
    door: Arc<FrontDoor>,
    refuse: Refuse,
}

impl Guard {
    /// `config`'s door. A malformed entry is refused by `ServerConfig::validate` before a
    /// server starts; a host that built the config itself gets the door without its extra
    /// entries (fail closed).
    pub(crate) fn of(config: &HttpConfig, refuse: Refuse) -> Self {
        let door =
            FrontDoor::new(&config.allowed_hosts, &config.allowed_origins).unwrap_or_else(|why| {
                tracing::error!("{why}: accepting loopback and IP-address hosts only");
                FrontDoor::default()
            });
        Guard {
            door: Arc::new(door),
            refuse,
        }
    }
}

/// Turns away a request whose `Host` or `Origin` the door does not admit (403; 400 for no
/// or a malformed `Host`), before anything else reads it.
pub(crate) async fn guard(State(guard): State<Guard>, request: Request, next: Next) -> Response {
    match guard.door.admit(request.uri(), request.headers()) {
        Ok(()) => next.run(request).await,
        Err(refused) => {
            let (status, kind) = match &refused {
                Refused::BadHost(_) => (StatusCode::BAD_REQUEST, "bad_host"),
                Refused::Host(_) => (StatusCode::FORBIDDEN, "forbidden_host"),
                Refused::Origin(_) => (StatusCode::FORBIDDEN, "forbidden_origin"),
            };
            (guard.refuse)((status, kind, refused.message()))
        }
    }
}

/// The bearer token every request must carry, and how a server renders its refusal, for
/// [`require_token`].
#[derive(Debug, Clone)]
pub(crate) struct Token {
    token: Arc<String>,
    refuse: Refuse,
}

impl Token {
    pub(crate) fn new(token: String, refuse: Refuse) -> Self {
        Token {
            token: Arc::new(token),
            refuse,
        }
    }
}

/// Passes a request that carries `Authorization: Bearer <token>` (compared in constant
/// time); any other gets 401 with `WWW-Authenticate: Bearer`.
pub(crate) async fn require_token(
    State(token): State<Token>,
    request: Request,
    next: Next,
) -> Response {
    if carries_token(request.headers(), &token.token) {
        return next.run(request).await;
    }
    let mut response = (token.refuse)((
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "a bearer token is required (Authorization: Bearer <token>)".into(),
    ));
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// True when `headers` carry `Authorization: Bearer <token>`, compared in constant time.
fn carries_token(headers: &HeaderMap, token: &str) -> bool {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    bool::from(given.as_bytes().ct_eq(token.as_bytes()))
}

/// An entry of `allowed_hosts`: the host, and its port if one was named.
#[derive(Debug, Clone, PartialEq, Eq)]
struct AllowedHost {
    host: String,
    port: Option<u16>,
}

/// An entry of `allowed_origins`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum AllowedOrigin {
    Null,
    Tuple {
        scheme: String,
        host: String,
        /// `None`: any port (`:*`).
        port: Option<u16>,
    },
}

/// The hosts and origins a server accepts (see the [module docs](self)); the default door
/// lists none beyond loopback and addresses.
#[derive(Debug, Clone, Default)]
pub(crate) struct FrontDoor {
    hosts: Vec<AllowedHost>,
    origins: Vec<AllowedOrigin>,
}

/// Why a request was turned away at the door.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refused {
    /// No `Host`, or one that does not parse.
    BadHost(String),
    /// A `Host` the server does not answer to.
    Host(String),
    /// An `Origin` the server does not answer to.
    Origin(String),
}

impl Refused {
    /// What the client is told.
    pub(crate) fn message(&self) -> String {
        match self {
            Refused::BadHost(why) => format!("the request's Host header {why}"),
            Refused::Host(host) => format!(
                "this server does not answer to Host `{host}` (a DNS-rebinding guard); \
                 list it in [http] allowed_hosts (`--allowed-host`) to allow it"
            ),
            Refused::Origin(origin) => format!(
                "this server does not answer to a browser page from `{origin}`; list the \
                 origin in [http] allowed_origins (`--allowed-origin`) to allow it"
            ),
        }
    }
}

/// Lower-case, without IPv6 brackets.
fn normalize(host: &str) -> String {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase()
}

/// A scheme's default port (RFC 6454 §4: an origin omits it).
fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

/// `scheme://host[:port]` as a browser serializes an origin.
fn parse_origin(text: &str) -> Option<(String, String, Option<u16>)> {
    let uri: Uri = text.parse().ok()?;
    let scheme = uri.scheme_str()?.to_ascii_lowercase();
    let authority = uri.authority()?;
    // An origin is scheme, host and port: nothing else (no path, no user).
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() || authority.as_str().contains('@')
    {
        return None;
    }
    let port = authority.port_u16().or_else(|| default_port(&scheme));
    Some((scheme, normalize(authority.host()), port))
}

impl FrontDoor {
    /// The door for `allowed_hosts` and `allowed_origins` (the configuration's lists).
    ///
    /// # Errors
    ///
    /// The first entry that does not parse, and why.
    pub(crate) fn new(
        allowed_hosts: &[String],
        allowed_origins: &[String],
    ) -> Result<Self, String> {
        let mut hosts = Vec::with_capacity(allowed_hosts.len());
        for entry in allowed_hosts {
            let authority: axum::http::uri::Authority = entry.trim().parse().map_err(|_| {
                format!("[http] allowed_hosts: `{entry}` is not a host or host:port")
            })?;
            if authority.as_str().contains('@') {
                return Err(format!(
                    "[http] allowed_hosts: `{entry}` is not a host or host:port"
                ));
            }
            hosts.push(AllowedHost {
                host: normalize(authority.host()),
                port: authority.port_u16(),
            });
        }
        let mut origins = Vec::with_capacity(allowed_origins.len());
        for entry in allowed_origins {
            let entry = entry.trim();
            let bad = || {
                format!(
                    "[http] allowed_origins: `{entry}` is not an origin \
                     (scheme://host, scheme://host:port or scheme://host:*, or null)"
                )
            };
            if entry.eq_ignore_ascii_case("null") {
                origins.push(AllowedOrigin::Null);
                continue;
            }
            let (base, any_port) = match entry.strip_suffix(":*") {
                Some(base) => (base, true),
                None => (entry, false),
            };
            let (scheme, host, port) = parse_origin(base).ok_or_else(bad)?;
            if any_port
                && base
                    .rsplit_once(':')
                    .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
            {
                return Err(bad());
            }
            origins.push(AllowedOrigin::Tuple {
                scheme,
                host,
                port: if any_port { None } else { port },
            });
        }
        Ok(FrontDoor { hosts, origins })
    }

    /// Whether a request with `uri` and `headers` may come in.
    ///
    /// # Errors
    ///
    /// [`Refused`] saying which header turned it away.
    pub(crate) fn admit(&self, uri: &Uri, headers: &HeaderMap) -> Result<(), Refused> {
        self.check_host(uri, headers)?;
        self.check_origin(headers)
    }

    fn check_host(&self, uri: &Uri, headers: &HeaderMap) -> Result<(), Refused> {
        let authority = match headers.get(header::HOST) {
            Some(value) => {
                let text = value
                    .to_str()
                    .map_err(|_| Refused::BadHost("is not text".into()))?;
                text.parse::<axum::http::uri::Authority>()
                    .map_err(|_| Refused::BadHost(format!("`{text}` is not host[:port]")))?
            }
            None => uri
                .authority()
                .cloned()
                .ok_or_else(|| Refused::BadHost("is missing".into()))?,
        };
        if authority.as_str().contains('@') {
            return Err(Refused::BadHost(format!(
                "`{}` is not host[:port]",
                authority.as_str()
            )));
        }
        let host = normalize(authority.host());
        let port = authority.port_u16();
        let allowed = host == "localhost"
            || host.parse::<IpAddr>().is_ok()
            || self
                .hosts
                .iter()
                .any(|a| a.host == host && a.port.is_none_or(|p| Some(p) == port));
        if allowed {
            Ok(())
        } else {
            Err(Refused::Host(authority.as_str().to_owned()))
        }
    }

    fn check_origin(&self, headers: &HeaderMap) -> Result<(), Refused> {
        let Some(value) = headers.get(header::ORIGIN) else {
            return Ok(());
        };
        let text = value
            .to_str()
            .map_err(|_| Refused::Origin(String::from_utf8_lossy(value.as_bytes()).into()))?
            .trim();
        if text.eq_ignore_ascii_case("null") {
            return if self.origins.contains(&AllowedOrigin::Null) {
                Ok(())
            } else {
                Err(Refused::Origin(text.to_owned()))
            };
        }
        let refused = || Refused::Origin(text.to_owned());
        let (scheme, host, port) = parse_origin(text).ok_or_else(refused)?;
        let loopback = matches!(scheme.as_str(), "http" | "https")
            && (host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback()));
        let listed = self.origins.iter().any(|allowed| match allowed {
            AllowedOrigin::Null => false,
            AllowedOrigin::Tuple {
                scheme: s,
                host: h,
                port: p,
            } => *s == scheme && *h == host && p.is_none_or(|p| Some(p) == port),
        });
        if loopback || listed {
            Ok(())
        } else {
            Err(refused())
        }
    }
}

#[cfg(test)]
#[path = "front_door_tests.rs"]
mod tests;
