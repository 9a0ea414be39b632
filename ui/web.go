package ui

import (
	"embed"
	"net/http"

	"github.com/labstack/echo/v4"
)

// The web page: plain HTML, CSS and JavaScript, embedded, no CDN.
//
//go:embed web/index.html web/app.css web/app.js
var web embed.FS

// contentSecurityPolicy keeps the page to its own files: no inline
// scripts, no third-party anything, no framing.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; " +
	"form-action 'self'; base-uri 'none'; frame-ancestors 'none'"

func (s *Server) webRoutes(e *echo.Echo) {
	serve := func(name, ctype string) echo.HandlerFunc {
		return func(c echo.Context) error {
			b, err := web.ReadFile("web/" + name)
			if err != nil {
				return err
			}
			h := c.Response().Header()
			h.Set("Content-Security-Policy", contentSecurityPolicy)
			h.Set("X-Content-Type-Options", "nosniff")
			h.Set("Referrer-Policy", "no-referrer")
			h.Set("Cache-Control", "no-cache")
			return c.Blob(http.StatusOK, ctype, b)
		}
	}
	e.GET("/", serve("index.html", "text/html; charset=utf-8"))
	e.GET("/app.js", serve("app.js", "text/javascript; charset=utf-8"))
	e.GET("/app.css", serve("app.css", "text/css; charset=utf-8"))
}
