//! The `net.fetch` tool as a host declares it: the CLI's `--net-allow`, `--net-allow-address`
//! and `--secret` flags and a server's `[net]` table are the same [`NetConfig`], turned into
//! the tool by [`NetConfig::fetch_tool`] in one place.

use serde::{Deserialize, Serialize};

use super::{FetchLimits, FetchTool, HostPattern, NetPolicy, Secret, Secrets};

/// What the network tool may reach, and the secrets it may carry there.
///
/// In a server's TOML:
///
/// ```toml
/// [net]
/// allow = ["api.example.com", "*.example.org:8443"]
/// allow_addresses = ["10.1.0.0/16"]   # internal ranges an allowed host may resolve to
///
/// [[net.secrets]]
/// name = "API_TOKEN"      # the code writes PYCAGE_SECRET_API_TOKEN
/// env = "EXAMPLE_TOKEN"   # the host's environment variable holding the value
/// hosts = ["api.example.com"]
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NetConfig {
    /// The hosts, as [`HostPattern`]s; empty means no tool.
    pub allow: Vec<String>,
    /// Ranges (CIDR) let through the address check, which refuses loopback, private and
    /// link-local addresses otherwise.
    pub allow_addresses: Vec<String>,
    /// The secrets.
    pub secrets: Vec<SecretConfig>,
}

/// A secret, by the environment variable that holds its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretConfig {
    /// The name (`API_TOKEN`: capitals, digits, `_`); the placeholder is
    /// `PYCAGE_SECRET_` and the name.
    pub name: String,
    /// The host's environment variable holding the value.
    pub env: String,
    /// The hosts the value may be sent to.
    pub hosts: Vec<String>,
}

impl SecretConfig {
    /// The CLI's form, `NAME=ENV_VAR@HOST[,HOST...]`.
    ///
    /// # Errors
    ///
    /// A message naming the form when `spec` is not of it.
    pub fn parse_flag(spec: &str) -> Result<SecretConfig, String> {
        let bad = || format!("secret {spec:?}: give NAME=ENV_VAR@HOST[,HOST...]");
        let (name, rest) = spec.split_once('=').ok_or_else(bad)?;
        let (env, hosts) = rest.split_once('@').ok_or_else(bad)?;
        if name.is_empty() || env.is_empty() || hosts.is_empty() {
            return Err(bad());
        }
        Ok(SecretConfig {
            name: name.to_owned(),
            env: env.to_owned(),
            hosts: hosts.split(',').map(str::to_owned).collect(),
        })
    }
}

impl NetConfig {
    /// True when it declares nothing.
    pub fn is_empty(&self) -> bool {
        self == &NetConfig::default()
    }

    /// The tool this declares, `None` when it allows no host; a secret's value is read with
    /// `env` (the process environment, in a host).
    ///
    /// # Errors
    ///
    /// A message naming the entry that is unusable: a host or range that does not parse, a
    /// secret without its variable, ranges or secrets without any allowed host.
    pub fn fetch_tool(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<FetchTool>, String> {
        if self.allow.is_empty() {
            if !self.is_empty() {
                return Err("network: address ranges and secrets need an allowed host".into());
            }
            return Ok(None);
        }
        let mut policy = NetPolicy::new();
        for host in &self.allow {
            policy = policy.allow(host.parse::<HostPattern>()?);
        }
        for range in &self.allow_addresses {
            let range = range
                .parse()
                .map_err(|e| format!("address range {range:?}: {e}"))?;
            policy = policy.allow_address(range);
        }
        let mut secrets = Secrets::new();
        for secret in &self.secrets {
            let name = &secret.name;
            let value = env(&secret.env).ok_or_else(|| {
                format!(
                    "secret {name}: the environment variable {} is not set",
                    secret.env
                )
            })?;
            let hosts = secret
                .hosts
                .iter()
                .map(|h| h.parse::<HostPattern>())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("secret {name}: {e}"))?;
            secrets = secrets.with(Secret::new(name.as_str(), value, hosts)?);
        }
        FetchTool::new(policy, secrets, FetchLimits::default()).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tool;

    #[test]
    fn the_flag_form_of_a_secret() {
        let s = SecretConfig::parse_flag("TOKEN=MY_TOKEN@api.example.com,*.example.org").unwrap();
        assert_eq!(s.name, "TOKEN");
        assert_eq!(s.env, "MY_TOKEN");
        assert_eq!(s.hosts, ["api.example.com", "*.example.org"]);
        for bad in ["TOKEN", "TOKEN=VAR", "=VAR@h", "TOKEN=@h", "TOKEN=VAR@"] {
            assert!(
                SecretConfig::parse_flag(bad)
                    .unwrap_err()
                    .contains("NAME=ENV_VAR@HOST"),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_config_becomes_the_tool_or_an_error_naming_the_entry() {
        let config: NetConfig = toml::from_str(
            r#"
            allow = ["api.example.com"]
            allow_addresses = ["10.0.0.0/8"]
            [[secrets]]
            name = "TOKEN"
            env = "VAR"
            hosts = ["api.example.com"]
            "#,
        )
        .unwrap();
        let tool = config
            .fetch_tool(|v| (v == "VAR").then(|| "tok".to_owned()))
            .unwrap()
            .unwrap();
        assert!(tool.description().contains("api.example.com"));
        assert!(!tool.description().contains("tok\""));

        let missing = config.fetch_tool(|_| None).unwrap_err();
        assert!(missing.contains("VAR is not set"), "{missing}");

        assert!(NetConfig::default().fetch_tool(|_| None).unwrap().is_none());
        let orphan = NetConfig {
            allow_addresses: vec!["10.0.0.0/8".into()],
            ..NetConfig::default()
        };
        assert!(orphan.fetch_tool(|_| None).is_err());

        for text in [
            "allow = [\"ftp://ok.example\"]",
            "allow = [\"ok.example\"]\nallow_addresses = [\"10.0.0.0/33\"]",
            "allow = [\"ok.example\"]\n[[secrets]]\nname = \"lower\"\nenv = \"VAR\"\nhosts = [\"ok.example\"]",
        ] {
            let config: NetConfig = toml::from_str(text).unwrap();
            assert!(config.fetch_tool(|_| Some("v".into())).is_err(), "{text}");
        }
        assert!(toml::from_str::<NetConfig>("allowed = []").is_err());
    }
}
