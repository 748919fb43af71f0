app_name = "search"
urlpatterns = []
