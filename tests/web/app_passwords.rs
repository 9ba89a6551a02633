//! A person's own app passwords (issue 50, item 2): made on the web page and shown once, used by
//! a real WebDAV request, listed with their last use, revoked; forms without the page's token,
//! another user and hostile device names change nothing and see nothing.

use super::{
    ALICE, BOB, Page, Visitor, alice, assert_page_headers, html_unescape, page_of, urlencode,
};
use crate::common::{TestServer, attr_after};
use reqwest::Method;

const PAGE: &str = "/web/app-passwords";
const REVOKE: &str = "/web/app-passwords/revoke";
const MAC: &str = "Alice's Mac";

/// The text of the first `<code class="{class}">` of a page.
fn code(page: &Page, class: &str) -> Option<String> {
    let open = format!("<code class=\"{class}\">");
    let start = page.body.find(&open)? + open.len();
    let len = page.body[start..].find("</code>")?;
    Some(html_unescape(&page.body[start..start + len]))
}

/// The row of the device `name` (as the page writes it, escaped) on the list page, if listed.
fn row<'a>(page: &'a Page, escaped_name: &str) -> Option<&'a str> {
    let cell = format!("<td class=\"name\">{escaped_name}</td>");
    let at = page.body.find(&cell)?;
    let start = page.body[..at].rfind("<tr")?;
    let end = at + page.body[at..].find("</tr>")?;
    Some(&page.body[start..end])
}

/// `PROPFIND` Depth 0 of Alice's account over WebDAV, signed in with HTTP Basic.
async fn propfind(s: &TestServer, password: &str) -> u16 {
    reqwest::Client::new()
        .request(
            Method::from_bytes(b"PROPFIND").unwrap(),
            s.url("/dav/Acme/"),
        )
        .basic_auth(ALICE, Some(password))
        .header("Depth", "0")
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread")]
async fn app_passwords_are_made_used_and_revoked_on_the_web_page() {
    let s = TestServer::start().await;
    let (alice, token) = alice(&s).await;
    let names = |email: &'static str| {
        let store = s.store.clone();
        move || {
            store
                .list_app_passwords(email)
                .unwrap()
                .into_iter()
                .map(|p| p.name)
                .collect::<Vec<_>>()
        }
    };
    let alices = names(ALICE);

    // Reached from the header of every page.
    let home = alice.get("/web/").await;
    assert!(
        home.body
            .contains("<a class=\"app-passwords\" href=\"/web/app-passwords\">"),
        "{}",
        home.body
    );
    let empty = alice.get(PAGE).await;
    assert_eq!(empty.status, 200, "{}", empty.body);
    assert_page_headers(&empty, "app passwords");
    assert!(empty.body.contains("No app passwords yet"));
    // Without a session: the sign-in page, and back here after.
    let stranger = Visitor::new(&s).get(PAGE).await;
    assert_eq!(stranger.status, 303);
    assert_eq!(
        stranger.location(),
        format!("/web/signin?next={}", urlencode(PAGE))
    );

    // A post without the page's token (or with a wrong one) adds nothing.
    for form in [vec![("name", MAC)], vec![("name", MAC), ("csrf", "guess")]] {
        let r = alice.post(PAGE, &form).await;
        assert_eq!(r.status, 403, "{}", r.body);
        assert!(r.body.contains("Nothing was changed"));
        assert!(alices().is_empty(), "{form:?} added one");
    }
    let cross_site = page_of(
        alice
            .http
            .post(s.url(PAGE))
            .header("Cookie", alice.cookie.as_deref().unwrap())
            .header("Origin", "http://evil.example")
            .form(&[("csrf", token.as_str()), ("name", MAC)])
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(cross_site.status, 403);
    assert!(alices().is_empty(), "another site's post added one");

    // Added from the page: the password shown once, with where and as whom to sign in.
    let added = alice.post(PAGE, &[("csrf", &token), ("name", MAC)]).await;
    assert_eq!(added.status, 200, "{}", added.body);
    assert_page_headers(&added, "the new app password");
    assert_eq!(added.header("cache-control"), "no-store");
    assert!(added.headers.get("location").is_none());
    assert!(added.set_cookie("vaultfs_session").is_none());
    let password = code(&added, "app-password").expect("the password on the page");
    assert_eq!(password.len(), 27, "{password}");
    assert_eq!(code(&added, "user-name").as_deref(), Some(ALICE));
    assert_eq!(
        code(&added, "dav-url").as_deref(),
        Some(s.url("/dav/Acme/").as_str())
    );
    assert!(added.body.contains("Alice&#39;s Mac"));
    assert_eq!(alices(), [MAC]);

    // The list: the device, never the password, not used yet.
    let list = alice.get(PAGE).await;
    assert_eq!(list.status, 200);
    assert!(!list.body.contains(&password), "the password is shown once");
    let mac = row(&list, "Alice&#39;s Mac").expect("the device is listed");
    assert!(mac.contains("never"), "{mac}");

    // A real WebDAV request with it, over HTTP Basic; the list then says when it was used.
    assert_eq!(propfind(&s, &password).await, 207);
    assert_eq!(propfind(&s, "wrong-password").await, 401);
    let list = alice.get(PAGE).await;
    let mac = row(&list, "Alice&#39;s Mac").unwrap();
    let used = &mac[mac.find("class=\"modified used\"").unwrap()..];
    assert!(
        used.contains("<time datetime=") && !used.contains("never"),
        "{mac}"
    );

    // Names that will not do: the store's refusal on the page, the name typed kept, nothing
    // added.
    let twice = alice.post(PAGE, &[("csrf", &token), ("name", MAC)]).await;
    assert_eq!(twice.status, 409, "{}", twice.body);
    assert!(
        twice.body.contains("You have an app password named"),
        "{}",
        twice.body
    );
    assert!(code(&twice, "app-password").is_none());
    for (name, why) in [
        ("", "empty"),
        ("   ", "blank"),
        (&"x".repeat(101), "over-long"),
        ("tab\there", "a control character"),
    ] {
        let r = alice.post(PAGE, &[("csrf", &token), ("name", name)]).await;
        assert_eq!(r.status, 400, "{why}: {}", r.body);
        assert!(
            r.body.contains("A device name is 1 to 100 characters"),
            "{why}: {}",
            r.body
        );
        assert!(code(&r, "app-password").is_none(), "{why}");
    }
    assert_eq!(alices(), [MAC]);

    // A device name that would be markup stays text, on the page that shows it and the list.
    let hostile = "<b>bold</b> \"><script>alert(1)</script>";
    let r = alice
        .post(PAGE, &[("csrf", &token), ("name", hostile)])
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let list = alice.get(PAGE).await;
    let escaped = "&lt;b&gt;bold&lt;/b&gt; &quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;";
    for p in [&r, &list] {
        assert!(!p.body.contains("<b>bold"), "{}", p.body);
        assert!(!p.body.contains("<script>alert"), "{}", p.body);
        assert!(
            p.body.contains(
                "&lt;b&gt;bold&lt;/b&gt; &quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;"
            )
        );
    }
    // Its revoke form carries the name back as it was.
    let field = attr_after(row(&list, escaped).unwrap(), "name=\"name\"", "value").unwrap();
    assert_eq!(html_unescape(&field), hostile);
    let bold = alice
        .post(
            REVOKE,
            &[("csrf", &token), ("name", &html_unescape(&field))],
        )
        .await;
    assert_eq!(bold.status, 303, "{}", bold.body);
    assert_eq!(alices(), [MAC]);

    // Bob sees none of Alice's, and cannot revoke hers by its name.
    s.store.add_user(BOB, "Other", "bob-pw").unwrap();
    let bob = Visitor::sign_in(&s, BOB, "bob-pw").await;
    let bobs_token = bob.form_token().await;
    let his = bob.get(PAGE).await;
    assert_eq!(his.status, 200);
    assert!(his.body.contains("No app passwords yet"), "{}", his.body);
    assert!(!his.body.contains("Alice"), "{}", his.body);
    let r = bob
        .post(REVOKE, &[("csrf", &bobs_token), ("name", MAC)])
        .await;
    assert_eq!(r.status, 404, "{}", r.body);
    assert!(r.body.contains("You have no app password named"));
    // Nor with her page's token (it is her session's, not his).
    let r = bob.post(REVOKE, &[("csrf", &token), ("name", MAC)]).await;
    assert_eq!(r.status, 403);
    assert_eq!(alices(), [MAC]);
    assert_eq!(propfind(&s, &password).await, 207, "Bob revoked hers");

    // Alice's revoke without the page's token changes nothing either.
    for form in [
        vec![("name", MAC)],
        vec![("name", MAC), ("csrf", &bobs_token)],
    ] {
        let r = alice.post(REVOKE, &form).await;
        assert_eq!(r.status, 403, "{}", r.body);
        assert_eq!(alices(), [MAC], "{form:?} revoked it");
    }
    assert_eq!(propfind(&s, &password).await, 207);

    // Revoked from the page: back to the list, and the device is signed out.
    let r = alice.post(REVOKE, &[("csrf", &token), ("name", MAC)]).await;
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(r.location(), PAGE);
    assert!(alices().is_empty());
    assert_eq!(propfind(&s, &password).await, 401);
    let list = alice.get(PAGE).await;
    assert!(row(&list, "Alice&#39;s Mac").is_none(), "{}", list.body);
    assert!(list.body.contains("No app passwords yet"));
    // Revoked twice: said so, nothing else.
    let again = alice.post(REVOKE, &[("csrf", &token), ("name", MAC)]).await;
    assert_eq!(again.status, 404);
    assert!(again.body.contains("You have no app password named"));
}
