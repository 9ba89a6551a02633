//! Authentication: tokens and account isolation, and the pin exchange (its errors, page and
//! lockout).

use reqwest::Method;
use serde_json::{Value, json};

use crate::common::{Creds, TestServer, login, pin_in};
use crate::{Api, VAULT, assert_error, names, setup};

#[tokio::test(flavor = "multi_thread")]
async fn authentication_and_account_isolation() {
    let (s, alice) = setup().await;
    let bob_creds = s.user("bob@example.org", "Bobco").await;
    let bob = Api::new(&s, &bob_creds);
    let id = alice.upload(VAULT, "secret.txt", b"alice only").await;
    let bob_id = bob
        .upload("/nodes/pth/Bobco/My%20First%20Vault", "b.txt", b"bob")
        .await;

    // No, malformed, wrong, or someone else's token.
    assert_error(&Api::anonymous(&s).get(VAULT).await, 401, "invalid_token");
    for header in ["Bearer abc", "Basic !!!", "Basic YWxpY2U="] {
        let resp = alice
            .http
            .get(format!("{}{VAULT}", s.base))
            .header("Authorization", header)
            .send()
            .await
            .unwrap();
        let st = resp.status();
        assert_error(&(st, resp.json().await.unwrap()), 401, "invalid_token");
    }
    let wrong = Api::new(
        &s,
        &Creds {
            email: "alice@example.com".into(),
            token: "not-a-token".into(),
        },
    );
    assert_error(&wrong.get(VAULT).await, 401, "invalid_token");
    let mixed = Api::new(
        &s,
        &Creds {
            email: "alice@example.com".into(),
            token: bob_creds.token.clone(),
        },
    );
    assert_error(&mixed.get(VAULT).await, 401, "invalid_token");

    // Bob cannot reach Alice's account by path, by ID, or as a copy/move destination.
    assert_error(&bob.get(VAULT).await, 403, "forbidden");
    assert_error(
        &bob.get("/nodes/pth/Acme?children=1").await,
        403,
        "forbidden",
    );
    assert_error(&bob.get("/nodes/pth/NoSuchAccount").await, 403, "forbidden");
    // By ID: not found, as an unused ID (tests/abuse/ compares the two).
    assert_error(
        &bob.get(&format!("/files/id/Document/{id}")).await,
        404,
        "not_found",
    );
    assert_error(
        &bob.get(&format!("/preview/id/Document/{id}")).await,
        404,
        "not_found",
    );
    assert_error(
        &bob.call(
            Method::PUT,
            &format!("/nodes/upload/{id}"),
            Some(json!({"length": 1})),
        )
        .await,
        404,
        "not_found",
    );
    assert_error(
        &bob.call(Method::DELETE, &format!("{VAULT}/secret.txt"), None)
            .await,
        403,
        "forbidden",
    );
    let steal = json!({"copy": {"dst_uri": "/nodes/pth/Bobco/My First Vault/stolen.txt", "replace": "fail"}});
    assert_error(
        &bob.call(Method::POST, &format!("{VAULT}/secret.txt"), Some(steal))
            .await,
        403,
        "forbidden",
    );
    let plant = json!({"move": {"dst_uri": "/nodes/pth/Acme/My First Vault/planted.txt", "replace": "replace"}});
    assert_error(
        &bob.call(
            Method::POST,
            "/nodes/pth/Bobco/My%20First%20Vault/b.txt",
            Some(plant),
        )
        .await,
        403,
        "forbidden",
    );
    let (_, v) = bob.get("/nodes/pth?children=1").await;
    assert_eq!(names(&v), ["Bobco"]);
    assert_eq!(alice.download(&id).await, b"alice only");
    assert_eq!(bob.download(&bob_id).await, b"bob");

    // Expired and revoked tokens.
    s.store.expire_tokens("bob@example.org").unwrap();
    assert_error(&bob.get("/nodes/pth").await, 401, "token_expired");
    s.store.revoke_tokens("alice@example.com").unwrap();
    assert_error(&alice.get("/nodes/pth").await, 401, "invalid_token");
    // A new login works again.
    let token = login(&s.base, "alice@example.com", "pw-alice@example.com").await;
    let alice = Api::new(
        &s,
        &Creds {
            email: "alice@example.com".into(),
            token,
        },
    );
    assert_eq!(alice.get("/nodes/pth").await.0, 200);
    // Removing a user removes their tokens.
    s.store.remove_user("alice@example.com").unwrap();
    assert_error(&alice.get("/nodes/pth").await, 401, "invalid_token");
}

#[tokio::test(flavor = "multi_thread")]
async fn pin_exchange_errors_page_and_lockout() {
    let s = TestServer::start().await;
    s.store
        .add_user("carol@example.com", "Carol", "right password")
        .unwrap();
    let anon = Api::anonymous(&s);
    assert_error(
        &anon.call(Method::POST, "/pin/end", Some(json!({}))).await,
        400,
        "missing_parameter",
    );
    assert_error(
        &anon
            .call(Method::POST, "/pin/end", Some(json!({"client_id": "nope"})))
            .await,
        400,
        "unknown_client",
    );
    let (st, v) = anon
        .call(
            Method::POST,
            "/pin/end",
            Some(json!({"client_id": "vaultfs"})),
        )
        .await;
    assert_eq!(st, 200);
    assert!(
        v["message"]["authorization_uri"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{}/pin/authorize", s.base))
    );

    // A bad password shows the form again with an error, never a pin.
    let page = anon
        .http
        .post(s.url("/pin/authorize"))
        .form(&[
            ("client_id", "vaultfs"),
            ("email", "carol@example.com"),
            ("password", "wrong"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 401);
    let html = page.text().await.unwrap();
    assert!(pin_in(&html).is_none());
    assert!(html.contains("<form") && html.contains("wrong e-mail address or password"));
    let unknown = anon
        .http
        .get(s.url("/pin/authorize?client_id=evil"))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 400);

    // Each sign-in shows a new pin, which replaces the one before.
    let pin0 = pin_in(&sign_in(&s, "right password").await).unwrap();
    let pin1 = pin_in(&sign_in(&s, "right password").await).unwrap();
    assert_ne!(pin0, pin1);
    assert_eq!(pin1.len(), 8);

    let auth = |body: Value| {
        let anon = &anon;
        async move { anon.call(Method::POST, "/pin/auth", Some(body)).await }
    };
    assert_error(
        &auth(json!({"pin_info": {"client_id": "vaultfs", "pin": 1}})).await,
        400,
        "missing_parameter",
    );
    assert_error(
        &auth(json!({"user_email": "carol@example.com"})).await,
        400,
        "missing_parameter",
    );
    assert_error(
        &auth(json!({"user_email": "carol@example.com", "pin_info": {"pin": 1}})).await,
        400,
        "missing_parameter",
    );
    assert_error(
        &auth(json!({"user_email": "carol@example.com", "pin_info": {"client_id": "vaultfs"}}))
            .await,
        400,
        "missing_parameter",
    );
    assert_error(
        &auth(
            json!({"user_email": "carol@example.com", "pin_info": {"client_id": "zzz", "pin": 1}}),
        )
        .await,
        400,
        "unknown_client",
    );
    assert_error(&auth(json!({"user_email": "nobody@example.com", "pin_info": {"client_id": "vaultfs", "pin": 1}})).await, 401, "invalid_pin");

    let replaced = json!({"user_email": "carol@example.com", "pin_info": {"client_id": "vaultfs", "pin": pin0.parse::<u64>().unwrap()}});
    assert_error(&auth(replaced).await, 401, "invalid_pin");
    let good = json!({"user_email": "carol@example.com", "pin_info": {"client_id": "vaultfs", "pin": pin1.parse::<u64>().unwrap()}});
    let (st, v) = auth(good.clone()).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["message"]["id"], "carol@example.com");
    assert_eq!(v["message"]["expires_in"], 14 * 24 * 3600);
    assert!(v["message"]["token"].as_str().unwrap().len() >= 40);

    // A pin works once.
    assert_error(&auth(good.clone()).await, 401, "invalid_pin");
    // Five wrong pins lock the exchange, even for the right pin.
    let wrong_pin: u64 = if pin1 == "12345678" {
        87654321
    } else {
        12345678
    };
    for _ in 0..4 {
        let bad = json!({"user_email": "carol@example.com", "pin_info": {"client_id": "vaultfs", "pin": wrong_pin}});
        assert_error(&auth(bad).await, 401, "invalid_pin");
    }
    assert_error(&auth(good).await, 429, "too_many_attempts");
    // Five wrong passwords lock the page the same way.
    for _ in 0..5 {
        sign_in(&s, "bad").await;
    }
    let html = sign_in(&s, "right password").await;
    assert!(pin_in(&html).is_none() && html.contains("too many failed attempts"));
}

async fn sign_in(s: &TestServer, password: &str) -> String {
    reqwest::Client::new()
        .post(s.url("/pin/authorize"))
        .form(&[
            ("client_id", "vaultfs"),
            ("email", "carol@example.com"),
            ("password", password),
        ])
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}
