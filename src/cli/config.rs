//! `$XDG_CONFIG_HOME/vaultfs/config.toml`: defaults for `vaultfs mount`, for every mount
//! (`[mount]`) and per mount point (`[mount."/home/me/Vault"]`). Keys are the long flags, every
//! one of them (`options.rs`: `cache_size = "4G"`, `read_only = true`, `server = "https://..."`,
//! `read_ahead = 512`); flags given on the command
//! line override them. `[server."URL"]` holds what belongs to a server rather than a mount:
//! `client_id`, the ID `vaultfs login` registers as there. `[serve]` holds defaults of
//! `vaultfs serve` (where its store is: `data_dir`, `database`, `blobs`, `s3_endpoint`; `listen`,
//! `public_url`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Flags `vaultfs serve` accepts from the config file.
const SERVE_KEYS: [&str; 6] = [
    "data_dir",
    "database",
    "blobs",
    "s3_endpoint",
    "listen",
    "public_url",
];

pub fn config_path() -> PathBuf {
    super::xdg_dir("XDG_CONFIG_HOME", ".config").join("config.toml")
}

/// The file's table; `None` when there is no file.
fn read_doc(file: &Path) -> Result<Option<toml::Table>, String> {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", file.display())),
    };
    text.parse()
        .map(Some)
        .map_err(|e| format!("{}: {e}", file.display()))
}

/// `client_id` of `[server."URL"]` (the URL without trailing slashes), if the file sets one.
pub fn server_client_id(file: &Path, server: &str) -> Result<Option<String>, String> {
    let Some(doc) = read_doc(file)? else {
        return Ok(None);
    };
    let Some(servers) = doc.get("server").and_then(toml::Value::as_table) else {
        return Ok(None);
    };
    let section = servers
        .iter()
        .find(|(url, _)| url.trim().trim_end_matches('/') == server)
        .map(|(_, v)| v);
    match section.and_then(|t| t.get("client_id")) {
        None => Ok(None),
        Some(toml::Value::String(id)) if !id.trim().is_empty() => Ok(Some(id.trim().to_string())),
        Some(_) => Err(format!(
            "{}: `client_id` of [server.\"{server}\"] must be a non-empty string",
            file.display()
        )),
    }
}

/// `~/x` and relative paths made absolute, so sections match however the path is written.
fn normalize(p: &str) -> PathBuf {
    let p = match p.strip_prefix("~/") {
        Some(rest) => std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_default()
            .join(rest),
        None => PathBuf::from(p),
    };
    std::fs::canonicalize(&p).unwrap_or(p)
}

/// The flags the config file's `[serve]` gives `vaultfs serve`.
pub fn serve_flags(file: &Path) -> Result<Vec<OsString>, String> {
    let Some(doc) = read_doc(file)? else {
        return Ok(Vec::new());
    };
    let Some(serve) = doc.get("serve") else {
        return Ok(Vec::new());
    };
    let serve = serve
        .as_table()
        .ok_or_else(|| format!("{}: `serve` must be a table", file.display()))?;
    let known: Vec<(String, bool)> = SERVE_KEYS.iter().map(|k| (k.to_string(), true)).collect();
    let mut flags = Vec::new();
    for (key, value) in serve {
        push_flag(&mut flags, &known, key, value, file, "[serve]")?;
    }
    Ok(flags)
}

/// The flags the config file gives a mount at `mountpoint` (general section first, then the
/// mount point's own, so the latter wins; the command line comes after both).
pub fn mount_flags(file: &Path, mountpoint: &Path) -> Result<Vec<OsString>, String> {
    let Some(doc) = read_doc(file)? else {
        return Ok(Vec::new());
    };
    let Some(mount) = doc.get("mount") else {
        return Ok(Vec::new());
    };
    let mount = mount
        .as_table()
        .ok_or_else(|| format!("{}: `mount` must be a table", file.display()))?;
    let here = normalize(&mountpoint.to_string_lossy());
    let known: Vec<(String, bool)> = super::options::mount_options()
        .into_iter()
        .map(|o| (o.key, o.takes_value))
        .collect();
    let mut flags = Vec::new();
    let mut own = None;
    for (key, value) in mount {
        match value {
            toml::Value::Table(t) => {
                if normalize(key) == here {
                    own = Some(t);
                }
            }
            v => push_flag(&mut flags, &known, key, v, file, "[mount]")?,
        }
    }
    if let Some(t) = own {
        for (key, value) in t {
            push_flag(
                &mut flags,
                &known,
                key,
                value,
                file,
                "its mount point's section",
            )?;
        }
    }
    Ok(flags)
}

/// The flag for `key = value`; `known` are the keys, each with whether it takes a value.
fn push_flag(
    flags: &mut Vec<OsString>,
    known: &[(String, bool)],
    key: &str,
    value: &toml::Value,
    file: &Path,
    section: &str,
) -> Result<(), String> {
    let name = key.replace('-', "_");
    let Some(&(_, takes_value)) = known.iter().find(|(k, _)| *k == name) else {
        let names: Vec<&str> = known.iter().map(|(k, _)| k.as_str()).collect();
        return Err(format!(
            "{}: unknown option `{key}` in {section} (known: {})",
            file.display(),
            names.join(", ")
        ));
    };
    let flag = format!("--{}", name.replace('_', "-"));
    match value {
        toml::Value::Boolean(true) if !takes_value => flags.push(flag.into()),
        toml::Value::Boolean(false) if !takes_value => {}
        toml::Value::String(s) if takes_value => flags.extend([flag.into(), s.into()]),
        toml::Value::Integer(n) if takes_value => flags.extend([flag.into(), n.to_string().into()]),
        toml::Value::Float(x) if takes_value => flags.extend([flag.into(), x.to_string().into()]),
        other => {
            let want = if takes_value {
                "a value"
            } else {
                "true or false"
            };
            return Err(format!(
                "{}: `{key}` is {want}, not {}",
                file.display(),
                other.type_str()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preview_keys() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.toml");
        std::fs::write(
            &file,
            "[mount]\npreviews = \"eager\"\npreview_cache_size = \"256M\"\n",
        )
        .unwrap();
        let flags = mount_flags(&file, &dir.path().join("mnt")).unwrap();
        assert_eq!(
            flags,
            ["--preview-cache-size", "256M", "--previews", "eager"].map(OsString::from)
        );
    }

    #[test]
    fn general_then_own_section() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.toml");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        std::fs::write(
            &file,
            format!(
                "[mount]\ncache_size = \"4G\"\ndir-ttl = 5\nread_only = false\n\n[mount.\"{}\"]\nread_only = true\nattr_ttl = 0.5\n\n[mount.\"/elsewhere\"]\nserver = \"http://x\"\n",
                mnt.display()
            ),
        )
        .unwrap();
        let flags: Vec<String> = mount_flags(&file, &mnt)
            .unwrap()
            .into_iter()
            .map(|f| f.into_string().unwrap())
            .collect();
        assert_eq!(
            flags,
            [
                "--cache-size",
                "4G",
                "--dir-ttl",
                "5",
                "--attr-ttl",
                "0.5",
                "--read-only"
            ]
        );
        assert!(
            mount_flags(&dir.path().join("none.toml"), &mnt)
                .unwrap()
                .is_empty()
        );
        std::fs::write(&file, "[mount]\nbogus = 1\n").unwrap();
        assert!(
            mount_flags(&file, &mnt)
                .unwrap_err()
                .contains("unknown option `bogus`")
        );
        std::fs::write(&file, "[mount\n").unwrap();
        assert!(mount_flags(&file, &mnt).is_err());
    }

    #[test]
    fn serve_section() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.toml");
        std::fs::write(
            &file,
            "[serve]\nblobs = \"s3://docs/vault\"\ns3-endpoint = \"http://127.0.0.1:9000\"\n[mount]\nread_only = true\n",
        )
        .unwrap();
        assert_eq!(
            serve_flags(&file).unwrap(),
            [
                "--blobs",
                "s3://docs/vault",
                "--s3-endpoint",
                "http://127.0.0.1:9000"
            ]
            .map(OsString::from)
        );
        std::fs::write(&file, "[serve]\nread_only = true\n").unwrap();
        assert!(serve_flags(&file).unwrap_err().contains("unknown option"));
        std::fs::write(&file, "[mount]\nread_only = true\n").unwrap();
        assert!(serve_flags(&file).unwrap().is_empty());
    }

    #[test]
    fn client_id_per_server() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.toml");
        assert_eq!(server_client_id(&file, "https://x").unwrap(), None);
        std::fs::write(
            &file,
            "[mount]\ncache_size = \"1G\"\n[server.\"https://x/\"]\nclient_id = \"acme-7\"\n",
        )
        .unwrap();
        assert_eq!(
            server_client_id(&file, "https://x").unwrap().as_deref(),
            Some("acme-7")
        );
        assert_eq!(server_client_id(&file, "https://y").unwrap(), None);
        // The mount ignores the server sections.
        assert_eq!(mount_flags(&file, &dir.path().join("m")).unwrap().len(), 2);
        std::fs::write(&file, "[server.\"https://x\"]\nclient_id = 3\n").unwrap();
        assert!(server_client_id(&file, "https://x").is_err());
    }
}
