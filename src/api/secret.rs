//! A secret, such as a delegation token: its `Debug` shows `Secret(***)`, so no log line, panic
//! or `{:?}` of a struct holding one can print it; [`Secret::expose`] is the one way to its text.

use std::fmt;

#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(text: impl Into<String>) -> Secret {
        Secret(text.into())
    }

    /// The secret's text, for where it must go (an Authorization header, the credentials file).
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl From<String> for Secret {
    fn from(text: String) -> Secret {
        Secret(text)
    }
}

impl From<&str> for Secret {
    fn from(text: &str) -> Secret {
        Secret(text.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::Secret;

    #[test]
    fn debug_hides_the_text_and_expose_gives_it() {
        #[derive(Debug)]
        #[allow(dead_code)] // read by Debug only
        struct Login {
            token: Secret,
        }
        let login = Login {
            token: Secret::new("tok-123"),
        };
        assert_eq!(format!("{login:?}"), "Login { token: Secret(***) }");
        assert_eq!(format!("{login:#?}").matches("tok-123").count(), 0);
        assert_eq!(login.token.expose(), "tok-123");
    }
}
