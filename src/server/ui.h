/* The built-in chat page served at "/": static HTML and JavaScript compiled
 * into the binary (no files to install). */
#ifndef ELLM_SERVER_UI_H
#define ELLM_SERVER_UI_H

extern const char ui_html[];

#endif
