//! A remote mount shaped for a link with latency (issue 33), on a real `vaultfs serve` over
//! loopback: the new files of a folder are created in few requests, a reader going through a
//! folder finds the next small files fetched ahead within the bound, and uploads refused with
//! 503 and Retry-After back off and still store every file. (Speed is the benchmark's:
//! scripts/bench --link.)

#[macro_use]
mod common;

use std::fs;
use std::time::Duration;

use common::env::{Env, VAULT, Via, put_elsewhere, stored};
use common::mount::wait_for;
use common::pattern;

/// How many times `needle` occurs in `hay`.
fn count(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

/// 120 small files (and 3 empty ones) copied in through a link of 20 ms each way: all stored,
/// in batches to a server that takes them (ours: many files a request; one a request before,
/// and the interface's three steps took three round trips a file), and each file read back
/// through the mount is its own.
#[test]
fn many_small_files_copied_in_are_stored_in_few_requests() {
    let Some(mut env) = Env::new(Via::Remote) else {
        return;
    };
    let m = env.mount(&[]);
    // In front of the server the mount was given (its address is the mount's login).
    let requests = env.record_requests(Duration::from_millis(20));
    let n = 120;
    let src = env._tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    for i in 0..n {
        fs::write(
            src.join(format!("doc-{i:03}.txt")),
            pattern(4096 + i, i as u64),
        )
        .unwrap();
    }
    // Empty ones among them (stored whole, as any other).
    for i in 0..3 {
        fs::write(src.join(format!("empty-{i}")), b"").unwrap();
    }
    let out = std::process::Command::new("cp")
        .arg("-r")
        .arg(&src)
        .arg(env.vault().join("docs"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    // A file closed and opened again reads its own bytes, stored or not yet.
    for i in (0..n).step_by(7) {
        let got = fs::read(env.vault().join(format!("docs/doc-{i:03}.txt"))).unwrap();
        assert_eq!(got, pattern(4096 + i, i as u64), "doc-{i:03}");
    }
    env.wait_uploaded();
    for i in 0..n {
        let name = format!("docs/doc-{i:03}.txt");
        assert_eq!(stored(&env, &name), pattern(4096 + i, i as u64), "{name}");
    }
    for i in 0..3 {
        assert_eq!(stored(&env, &format!("docs/empty-{i}")), b"");
    }
    let sent = requests.lock().unwrap().clone();
    let creates = count(&sent, b"\"create_file\"");
    let steps = count(&sent, b"PUT /nodes/upload/");
    let whole = count(&sent, b"PUT /nodes/pth/Local/My%20First%20Vault/docs/");
    let batches = count(&sent, b"POST /nodes/batch ");
    let files = count(&sent, b"{\"path\":[\"Local\",\"My First Vault\",\"docs\",");
    eprintln!(
        "{n} files: {batches} batches of {files} files, {whole} whole, {creates} create_file, {steps} upload steps"
    );
    assert_eq!((creates, steps, whole), (0, 0, 0));
    // Each file sent once, in far fewer requests than files.
    assert_eq!(files, n + 3);
    assert!((1..=n / 4).contains(&batches), "{batches} batches");
    drop(m);
}

/// A reader opening a folder's files in listing order gets the next ones fetched ahead, never
/// more than the bound past the last it opened (counted in the read cache's files and bytes),
/// and every file reads right, whether fetched ahead or not.
#[test]
fn files_fetched_ahead_stay_within_the_bound() {
    let Some(env) = Env::new(Via::Remote) else {
        return;
    };
    let n = 60;
    let size = 4096;
    for i in 0..n {
        put_elsewhere(&env, &format!("f-{i:03}"), &pattern(size, i as u64));
    }
    let m = env.mount(&[]);
    let cache_files = || m.status()["cache"]["files"].as_u64().unwrap() as usize;
    let cache_bytes = || m.status()["cache"]["used_bytes"].as_u64().unwrap() as usize;
    assert_eq!(fs::read_dir(env.vault()).unwrap().count(), n);
    // Three opens in order: the next files come without being read.
    let opened = 3;
    for i in 0..opened {
        let got = fs::read(env.vault().join(format!("f-{i:03}"))).unwrap();
        assert_eq!(got, pattern(size, i as u64));
    }
    let bound = opened + 16;
    wait_for(10, "files fetched ahead", || cache_files() == bound);
    // Nothing more comes: the reader has not gone on.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(cache_files(), bound);
    assert_eq!(cache_bytes(), bound * size);
    // A jump ends the pattern: nothing is fetched past it.
    let got = fs::read(env.vault().join("f-050")).unwrap();
    assert_eq!(got, pattern(size, 50));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(cache_files(), bound + 1);
    // Everything reads right, in order (fetched ahead or not).
    for i in 0..n {
        let got = fs::read(env.vault().join(format!("f-{i:03}"))).unwrap();
        assert_eq!(got, pattern(size, i as u64), "f-{i:03}");
    }
    assert_eq!(cache_files(), n);
    drop(m);
}

/// `rm -rf` over a server that checks a delete's base itself (ours says so in its answer):
/// one request a file, the DELETE, after the first; the look before each (a GET of the file,
/// for a server that would delete another writer's edit) went with every file: two round
/// trips a file over a link.
#[test]
fn rm_rf_over_a_server_that_checks_deletes_is_one_request_a_file() {
    let Some(mut env) = Env::new(Via::Remote) else {
        return;
    };
    let n = 30;
    let folder = vaultfs::api::NodePath::parse_uri(&format!("/nodes/pth/{VAULT}/tree")).unwrap();
    env.rt
        .block_on(vaultfs::backend::Backend::create_folder(
            &env.backend(),
            &folder,
        ))
        .unwrap();
    for i in 0..n {
        put_elsewhere(&env, &format!("tree/f-{i:02}.txt"), &pattern(100, i as u64));
    }
    let m = env.mount(&[]);
    let requests = env.record_requests(Duration::ZERO);
    let tree = env.vault().join("tree");
    // Each file read once: its version is known here, so each delete carries a base.
    for i in 0..n {
        assert_eq!(
            fs::read(tree.join(format!("f-{i:02}.txt"))).unwrap(),
            pattern(100, i as u64)
        );
    }
    let before = requests.lock().unwrap().len();
    let out = std::process::Command::new("rm")
        .arg("-rf")
        .arg(&tree)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(!tree.exists());
    let sent = requests.lock().unwrap()[before..].to_vec();
    let file = "/nodes/pth/Local/My%20First%20Vault/tree/f-";
    let deletes = count(&sent, format!("DELETE {file}").as_bytes());
    let looks = count(&sent, format!("GET {file}").as_bytes());
    assert_eq!(deletes, n, "{}", String::from_utf8_lossy(&sent));
    assert!(looks <= 1, "{looks} looks before deletes");
    // Gone from the store as well.
    assert!(common::env::stored_names(&env).is_empty());
    drop(m);
}

/// Another writer stores a version of a file after this mount's upload of it is stored and
/// before the mount hears its answer (answers come 300 ms late): the feed brings that version
/// after the answer, and the mount fetches it. It went by as this mount's own (its clock said
/// "uploaded here since"), and the mount showed its own older bytes for good (the model, seed
/// 1796589137872955081).
#[test]
fn a_version_stored_elsewhere_while_our_answer_is_on_its_way_is_fetched() {
    use vaultfs::api::checksum;
    use vaultfs::backend::Backend;
    let Some(mut env) = Env::new(Via::Remote) else {
        return;
    };
    let m = env.mount(&[]);
    // In front of the server the mount was given (its address is the mount's login).
    env.delay_answers(Duration::from_millis(300));
    let path = env.vault().join("shared.txt");
    fs::write(&path, b"the first words").unwrap();
    env.wait_uploaded();
    let ours = b"ours, a second version".to_vec();
    let theirs = b"theirs, stored a moment later".to_vec();
    fs::write(&path, &ours).unwrap();
    // The moment our version is the store's, theirs follows, well inside the 300 ms our
    // answer takes to come.
    let node =
        vaultfs::api::NodePath::parse_uri(&format!("/nodes/pth/{VAULT}/shared.txt")).unwrap();
    let b = env.backend();
    let md5 = checksum::hex(&checksum::Md5::digest(&ours));
    wait_for(20, "our version stored", || {
        let n = env.rt.block_on(b.node(&node)).unwrap();
        n.md5_checksum.as_deref().and_then(checksum::md5_hex) == Some(md5.clone())
    });
    put_elsewhere(&env, "shared.txt", &theirs);
    env.wait_uploaded();
    assert_eq!(stored(&env, "shared.txt"), theirs);
    wait_for(10, "their version shown", || {
        fs::read(&path).unwrap() == theirs
    });
    drop(m);
}

/// A server that lets one transfer of a user run at a time refuses the others (503 with
/// Retry-After): the uploads back off (the mount says so in its log) and every file is stored.
#[test]
fn uploads_refused_with_503_back_off_and_are_all_stored() {
    let options = vaultfs::server::ServerOptions {
        max_transfers_per_user: 1,
        ..Default::default()
    };
    let Some(env) = Env::new_with(Via::Remote, options) else {
        return;
    };
    // The one transfer the server allows the user is held from outside while the files are
    // written (a download of a large file left unread): every upload meets a 503 until it is
    // let go, whatever the timing (the mount's uploads alone overlapped or not by chance).
    put_elsewhere(&env, "held", &pattern(32 << 20, 99));
    let base = env.server.as_ref().unwrap().base.clone();
    let held = env.rt.block_on(async {
        use vaultfs::backend::Backend;
        use vaultfs::backend::remote::{RemoteBackend, RemoteConfig};
        let email = "tester@example.com";
        let token = common::login(&base, email, &format!("pw-{email}")).await;
        let remote = RemoteBackend::new(RemoteConfig::new(&base, email, &token)).unwrap();
        let path = vaultfs::api::NodePath::parse_uri(&format!("/nodes/pth/{VAULT}/held")).unwrap();
        let id = remote.node(&path).await.unwrap().file_id().unwrap();
        remote.download(&id, None).await.unwrap()
    });
    let m = env.mount(&[]);
    let n = 24;
    for i in 0..n {
        fs::write(
            env.vault().join(format!("b-{i:02}")),
            pattern((1 << 20) + i, i as u64),
        )
        .unwrap();
    }
    wait_for(30, "an upload refused and backed off", || {
        m.log_text().contains("uploads in flight: at most")
    });
    drop(held);
    env.wait_uploaded();
    for i in 0..n {
        let name = format!("b-{i:02}");
        assert_eq!(
            stored(&env, &name),
            pattern((1 << 20) + i, i as u64),
            "{name}"
        );
    }
    let log = m.log_text();
    assert!(
        log.contains("uploads in flight: at most"),
        "no back-off in the log:\n{log}"
    );
    drop(m);
}

/// nginx with TLS and HTTP/2 in front of `vaultfs serve`, as docs/deploy.md sets it up (the
/// public service is reached the same way): the mount trusts the CA it is told of
/// (`SSL_CERT_FILE`), speaks HTTP/2 to it (every request nginx logs is `HTTP/2.0`: one
/// connection for the uploads in flight, no handshake per connection behind a link), and stores
/// and reads back every file: the small ones in batches, a large one alone.
#[test]
fn the_mount_speaks_http2_to_a_tls_proxy_that_offers_it() {
    let Some(env) = Env::new(Via::Remote) else {
        return;
    };
    let nginx = std::path::Path::new("/usr/sbin/nginx");
    assert!(
        nginx.exists(),
        "nginx is not installed: .ci/run installs nginx-light for this test"
    );
    let dir = env._tmp.path().join("tls");
    fs::create_dir(&dir).unwrap();
    common::tls::make_certificates(&dir);
    let upstream = env.server.as_ref().unwrap().base.clone();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let d = dir.display();
    fs::write(
        dir.join("nginx.conf"),
        format!(
            "pid {d}/nginx.pid;\nerror_log {d}/error.log;\ndaemon off;\nworker_processes 1;\n\
             events {{}}\nhttp {{\n  access_log {d}/access.log;\n  \
             client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  \
             server {{\n    listen 127.0.0.1:{port} ssl http2;\n    \
             ssl_certificate {d}/server.crt;\n    ssl_certificate_key {d}/server.key;\n    \
             client_max_body_size 0;\n    proxy_request_buffering off;\n    \
             proxy_buffering off;\n    location / {{\n      proxy_pass {upstream};\n      \
             proxy_http_version 1.1;\n      proxy_set_header Host $host;\n    }}\n  }}\n}}\n"
        ),
    )
    .unwrap();
    let proxy = Nginx(
        std::process::Command::new(nginx)
            .args(["-c", &format!("{d}/nginx.conf"), "-p", &d.to_string()])
            .spawn()
            .unwrap(),
    );
    wait_for(10, "nginx to listen", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let base = format!("https://localhost:{port}");
    let creds = env
        .rt
        .block_on(env.server.as_ref().unwrap().user("h2@example.com", "Local"));
    common::save_login(
        &env.config.join("vaultfs/credentials.toml"),
        &base,
        creds,
        Duration::from_secs(3600),
    );
    let ca = dir.join("ca.crt");
    let cache = env.cache.to_str().unwrap();
    let args = ["--cache-dir", cache, "--server", &base, "--timeout", "10"];
    let envs = [
        ("XDG_CONFIG_HOME", env.config.as_path()),
        ("SSL_CERT_FILE", ca.as_path()),
    ];
    let m = common::mount::Mount::start_with_env(&env.mnt, &args, &envs);
    let n = 40;
    for i in 0..n {
        fs::write(
            env.vault().join(format!("h2-{i:02}")),
            pattern(5000 + i, i as u64),
        )
        .unwrap();
    }
    // And one past what a batch takes: sent alone.
    let big = pattern((2 << 20) + 3, 77);
    fs::write(env.vault().join("h2-big"), &big).unwrap();
    env.wait_uploaded();
    for i in 0..n {
        let name = format!("h2-{i:02}");
        assert_eq!(stored(&env, &name), pattern(5000 + i, i as u64), "{name}");
    }
    assert_eq!(stored(&env, "h2-big"), big);
    drop(m);
    drop(proxy);
    let log = fs::read_to_string(dir.join("access.log")).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    let batches = lines
        .iter()
        .filter(|l| l.contains("POST /nodes/batch "))
        .count();
    let alone = lines
        .iter()
        .filter(|l| l.contains("PUT /nodes/pth/") && l.contains("/h2-big "))
        .count();
    assert!(
        batches >= 1 && alone >= 1,
        "{batches} batches and {alone} whole PUTs through nginx:\n{log}"
    );
    let other: Vec<&&str> = lines.iter().filter(|l| !l.contains("HTTP/2.0\"")).collect();
    assert!(other.is_empty(), "requests not over HTTP/2: {other:#?}");
}

/// nginx's master process, stopped with its workers (SIGTERM) however the test ends.
struct Nginx(std::process::Child);

impl Drop for Nginx {
    fn drop(&mut self) {
        // SAFETY: a signal to our own child, which is not reaped before the wait below.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}
